"""The worker <-> server websocket protocol.

Every frame is one JSON object with a ``type`` field; :data:`ServerFrame` and :data:`WorkerFrame` are
pydantic discriminated unions over it, so a frame is parsed and validated in one step:

    frame = parse_worker_frame(text)      # raises ProtocolError on anything malformed

Handshake: the worker opens ``/workers/work`` with the headers ``X-API-Key`` and
``X-Protocol-Version`` (:data:`PROTOCOL_VERSION`); its first frame is a :class:`WorkerInfo`.
Then the server sends :class:`Work` (or :class:`EmbedWork` to embedding workers), :class:`Cancel` and
:class:`Ping`; the worker answers with :class:`Pong`, :class:`Token` (or several at once in a
:class:`TokenBatch`, protocol 2), :class:`GeneratedText`, :class:`Embeddings`, :class:`WorkerError` and
:class:`Drain`.

Bump :data:`PROTOCOL_VERSION` on any change an older peer would misread; the server refuses workers
older than :data:`MIN_SUPPORTED_PROTOCOL_VERSION` and tells them to upgrade.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from oasst_shared.model_configs import ModelConfig
from oasst_shared.sampling import SamplingParameters

# 2 added TokenBatch; a server speaking 2 still accepts 1, whose workers send a frame per token.
# 3 added WorkerError.backend_unavailable (a server speaking 3 accepts 1 and 2).
PROTOCOL_VERSION = 3
MIN_SUPPORTED_PROTOCOL_VERSION = 1

API_KEY_HEADER = "X-API-Key"
PROTOCOL_VERSION_HEADER = "X-Protocol-Version"

# Websocket close codes (RFC 6455 and the private 4000-4999 range).
CLOSE_POLICY_VIOLATION = 1008
CLOSE_GOING_AWAY = 1001
CLOSE_UNSUPPORTED_PROTOCOL = 4000
CLOSE_UNAUTHORIZED = 4001
CLOSE_UNSUPPORTED_DATA = 1003
CLOSE_MESSAGE_TOO_BIG = 1009
CLOSE_INTERNAL_ERROR = 1011
CLOSE_TRY_AGAIN_LATER = 1013
# The worker announced more than its API key allows (a model, slots or sockets): fatal for the worker.
CLOSE_KEY_FORBIDS = 4003

# The largest websocket message either side of the worker socket sends or accepts, in bytes (the
# websockets ``max_size`` of both ends). A frame that would be larger is never sent: the server fails
# the message it belongs to, the worker reports an error for its message instead.
MAX_FRAME_BYTES = 1 << 20

FinishReason = Literal["length", "eos_token", "stop_sequence", "cancelled"]
BackendKind = Literal["tgi", "openai", "cpu", "embedding", "fake"]
Role = Literal["system", "user", "assistant"]


class ProtocolError(ValueError):
    """A frame that is not valid JSON or does not match the schema."""


def text_problem(value: str) -> str | None:
    """Why ``value`` may not cross the worker socket (NUL, or not valid Unicode), or None."""
    if "\x00" in value:
        return "text holds a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "text is not valid Unicode (a lone surrogate)"
    return None


def _valid_text(value: str) -> str:
    problem = text_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


# Text a frame carries: no NUL, no lone surrogate (pydantic's JSON parser already refuses escaped ones).
SafeText = Annotated[str, AfterValidator(_valid_text)]
MessageId = Annotated[str, Field(min_length=1, max_length=64)]


def frame_bytes(text: str) -> int:
    """The UTF-8 size of a frame, without encoding it when its length alone settles the question."""
    if len(text) * 4 <= MAX_FRAME_BYTES:
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


def fits_in_frame(text: str) -> bool:
    return frame_bytes(text) <= MAX_FRAME_BYTES


class _Frame(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class Hardware(BaseModel):
    model_config = ConfigDict(extra="allow")

    cpu_count: int | None = None
    memory_bytes: int | None = None
    gpus: list[str] = Field(default_factory=list)


class ChatTurn(BaseModel):
    """One turn of the conversation a worker renders into a prompt."""

    role: Role
    content: str


# ---------------------------------------------------------------- worker -> server


class WorkerInfo(_Frame):
    """The worker's first frame: what it serves and how much at once."""

    type: Literal["worker_info"] = "worker_info"
    model_config_: ModelConfig = Field(alias="model_config")
    max_parallel_requests: int = Field(ge=1, le=1024)
    backend_kind: BackendKind
    worker_version: str = "unknown"
    hardware: Hardware = Field(default_factory=Hardware)

    model_config = ConfigDict(extra="forbid", populate_by_name=True, protected_namespaces=())


class Pong(_Frame):
    type: Literal["pong"] = "pong"
    ping_id: str
    free_slots: int = Field(ge=0)
    backend_healthy: bool = True
    backend_queue_length: int | None = None
    kv_cache_free_tokens: int | None = None


class Token(_Frame):
    type: Literal["token"] = "token"
    message_id: MessageId
    text: SafeText
    token_id: int | None = None
    logprob: float | None = None


class TokenBatch(_Frame):
    """Several tokens, in order, possibly of several messages (protocol 2).

    A worker sends one when tokens queue up faster than it sends frames: the server handles it as
    the same tokens sent one frame each.
    """

    type: Literal["token_batch"] = "token_batch"
    tokens: list[Token] = Field(min_length=1)


class GeneratedText(_Frame):
    type: Literal["generated_text"] = "generated_text"
    message_id: MessageId
    text: SafeText
    finish_reason: FinishReason
    generated_tokens: int = Field(ge=0)
    prompt_tokens: int | None = Field(default=None, ge=0)


class Embeddings(_Frame):
    """The result of an :class:`EmbedWork`: one vector per input, in input order."""

    type: Literal["embeddings"] = "embeddings"
    message_id: MessageId
    embeddings: list[list[float]] = Field(min_length=1)
    prompt_tokens: int = Field(ge=0)


class WorkerError(_Frame):
    """A job failed at the worker. ``retryable`` tells the server another worker may succeed.

    ``backend_unavailable`` (protocol 3): the backend refused before doing the work (no free slot,
    connection refused, a 5xx), which is not the message's fault. The server re-queues the message
    without counting the attempt and gives this worker no work until its pongs report a healthy backend.
    """

    type: Literal["error"] = "error"
    message_id: MessageId | None = None
    error: SafeText = Field(max_length=4000)
    retryable: bool = False
    backend_unavailable: bool = False


class Drain(_Frame):
    """The worker finishes its in-flight work and takes nothing new."""

    type: Literal["drain"] = "drain"


WorkerFrame = Annotated[
    WorkerInfo | Pong | Token | TokenBatch | GeneratedText | Embeddings | WorkerError | Drain,
    Field(discriminator="type"),
]

# ---------------------------------------------------------------- server -> worker


class Work(_Frame):
    """Generate one assistant message for this conversation."""

    type: Literal["work"] = "work"
    message_id: str
    chat_id: str | None = None
    model_config_name: str
    thread: list[ChatTurn] = Field(min_length=1)
    system_prompt: str | None = None
    sampling_parameters: SamplingParameters = Field(default_factory=SamplingParameters)
    # A raw prompt bypasses chat-template rendering (the /v1/completions path).
    raw_prompt: str | None = None
    attempt: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _text_is_valid(self) -> Work:
        texts = [t.content for t in self.thread] + [self.system_prompt or "", self.raw_prompt or ""]
        for text in texts:
            problem = text_problem(text)
            if problem is not None:
                raise ValueError(f"the conversation's {problem}")
        return self


class EmbedWork(_Frame):
    """Embed each input with the worker's encoder model (workers whose model kind is ``embedding``)."""

    type: Literal["embed"] = "embed"
    message_id: str
    model_config_name: str
    inputs: list[SafeText] = Field(min_length=1, max_length=2048)
    attempt: int = Field(default=1, ge=1)


class Cancel(_Frame):
    type: Literal["cancel"] = "cancel"
    message_id: str


class Ping(_Frame):
    type: Literal["ping"] = "ping"
    ping_id: str


class UpgradeRequired(_Frame):
    """Sent before closing a worker whose protocol version the server no longer speaks."""

    type: Literal["upgrade_required"] = "upgrade_required"
    server_protocol_version: int
    min_supported_version: int
    detail: str


ServerFrame = Annotated[Work | EmbedWork | Cancel | Ping | UpgradeRequired, Field(discriminator="type")]

_worker_frame_adapter: TypeAdapter[WorkerFrame] = TypeAdapter(WorkerFrame)
_server_frame_adapter: TypeAdapter[ServerFrame] = TypeAdapter(ServerFrame)


def parse_worker_frame(
    data: str | bytes,
) -> WorkerInfo | Pong | Token | TokenBatch | GeneratedText | Embeddings | WorkerError | Drain:
    try:
        return _worker_frame_adapter.validate_json(data)
    except ValidationError as exc:
        raise ProtocolError(_short_error(exc)) from None


def parse_server_frame(data: str | bytes) -> Work | EmbedWork | Cancel | Ping | UpgradeRequired:
    try:
        return _server_frame_adapter.validate_json(data)
    except ValidationError as exc:
        raise ProtocolError(_short_error(exc)) from None


def dump_frame(frame: BaseModel) -> str:
    return frame.model_dump_json(by_alias=True, exclude_none=False)


def _short_error(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False, include_input=False)
    parts = [f"{'.'.join(str(p) for p in e['loc']) or '<frame>'}: {e['msg']}" for e in errors[:3]]
    return "; ".join(parts)
