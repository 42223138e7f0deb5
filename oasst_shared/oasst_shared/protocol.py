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

Protocol 3 (additive): the worker's first frame carries its :class:`WorkerCapabilities` (structured
output, tools, log-probabilities, penalties); :class:`Work` may carry ``tools`` and ``tool_choice`` and
its thread ``tool`` turns and assistant ``tool_calls``; :class:`Token` may carry ``logprobs`` and
:class:`GeneratedText` ``tool_calls``. The server sends protocol 2 workers their work without the new
fields (:func:`dump_work`) and never routes them requests that need a capability they did not report.

Protocol 4 (additive; the server sends older workers nothing new): an embedding result too large for one
frame comes as :class:`EmbeddingsPart` frames, then the :class:`Embeddings` frame with the last vectors
(:func:`embeddings_frames`); :class:`WorkerError` may carry ``backend_died`` (the backend's connection broke
mid-request and its health check failed), which the server counts against the message, so that a message
that crashes backends is not sent to one after another. The server may ask a worker to count or tokenize
texts and conversations with its backend's tokenizer (:class:`Tokenize`, answered by :class:`Tokenized`)
and to turn token ids back into text (:class:`Detokenize`, :class:`Detokenized`); the worker reports
whether it answers them (``WorkerCapabilities.tokenize``). :class:`Work` may carry ``cut_newest_turn``.
The server sends neither to older workers (:func:`dump_work` drops the field; older workers are never
asked to count).

Protocol 6 (additive): models that follow demand. A worker whose backend can switch models lists the
model configs it can serve in ``WorkerInfo.servable`` and says whether its backend holds a model now
(``WorkerInfo.loaded``). The server may send it :class:`LoadModel` or :class:`UnloadModel`; from then on
it sends that worker no new work. The worker drains (its in-flight answers finish), unloads before it
loads, reports each step in :class:`ModelSwitch` frames (with the quantizer's progress where there is
one), and ends with a fresh :class:`WorkerInfo` saying what it serves now: the new model, or the
previous one if the load failed (its last ``model_switch`` then has step ``failed``), or, after an
unload, the model it last served with ``loaded`` false. The server never sends either frame to an older
worker nor to one with an empty ``servable``; a ``worker_info`` frame after the first is accepted only
from a protocol 6 worker that was told to switch.

The hot frames, ``token`` and ``token_batch``, are written and read without pydantic by
:mod:`oasst_shared.token_frames`, to the same schema: these models define them and document them.

Bump :data:`PROTOCOL_VERSION` on any change an older peer would misread; the server refuses workers
older than :data:`MIN_SUPPORTED_PROTOCOL_VERSION` and tells them to upgrade.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable
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

from oasst_shared.logprobs import TokenLogprob
from oasst_shared.model_configs import ModelConfig
from oasst_shared.sampling import SamplingParameters
from oasst_shared.tool_calls import ToolCall, ToolChoice, ToolDefinition

# 2 added TokenBatch; a server speaking 2 still accepts 1, whose workers send a frame per token.
# 3 added worker capabilities, tools, tool calls, logprobs and WorkerError.backend_unavailable; a server
# speaking 3 still accepts 1 and 2.
# 4 added EmbeddingsPart, WorkerError.backend_died and .request_refused, tokenize/tokenized, detokenize/detokenized,
# WorkerCapabilities.tokenize and Work.cut_newest_turn; a server speaking 4 still accepts 1 to 3.
# 5 added continuation: Work.answer_prefix, WorkerCapabilities.continue_answer and
# GeneratedText.prefix_tokens; and GeneratedText.cached_tokens; a server speaking 5 still accepts 1 to 4.
# 6 added model switching: WorkerInfo.servable and .loaded, load_model/unload_model, model_switch and a
# worker_info frame after a switch; a server speaking 6 still accepts 1 to 5.
PROTOCOL_VERSION = 6
TOOLS_PROTOCOL_VERSION = 3
TOKENIZE_PROTOCOL_VERSION = 4
CONTINUATION_PROTOCOL_VERSION = 5
SWITCHING_PROTOCOL_VERSION = 6
MIN_SUPPORTED_PROTOCOL_VERSION = 1

API_KEY_HEADER = "X-API-Key"
PROTOCOL_VERSION_HEADER = "X-Protocol-Version"
# Worker -> a TGI-style backend, on a continuation: the character index in ``inputs`` where the start of
# the answer (generated earlier) begins. The bundled CPU backend evaluates those tokens as it evaluates
# generated ones, so a greedy answer continues exactly; TGI ignores the header.
ANSWER_START_HEADER = "X-Answer-Start"

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
# The most text an error frame carries; workers cut longer errors to it.
MAX_ERROR_CHARS = 4000
# The most dimensions an embedding vector may have (the largest common models have 4,096): with the
# request's inputs, it bounds what the server holds while it assembles a result sent in parts.
MAX_EMBEDDING_DIMENSION = 8192
# The most bytes one float takes in a frame's JSON ("-2.2250738585072014e-308" is 24), with its comma:
# embedding results are cut into parts by this bound, so a part never needs to be measured.
_MAX_FLOAT_JSON_BYTES = 25
# Room in a frame for everything but the vectors (type, message id, start, prompt tokens).
_FRAME_ENVELOPE_BYTES = 1024
# The most texts (or token id lists) one tokenize or detokenize frame carries.
MAX_TOKENIZE_INPUTS = 64
# The most model configs a worker may list as servable (protocol 6).
MAX_SERVABLE_MODELS = 64

FinishReason = Literal["length", "eos_token", "stop_sequence", "cancelled"]
BackendKind = Literal["tgi", "openai", "cpu", "embedding", "fake"]
Role = Literal["system", "user", "assistant", "tool"]


class ProtocolError(ValueError):
    """A frame that is not valid JSON or does not match the schema."""


def text_problem(value: str) -> str | None:
    """Why ``value`` may not cross the worker socket (NUL, or not valid Unicode), or None."""
    if "\x00" in value:
        return "text holds a NUL character"
    if value.isascii():  # a flag CPython keeps: most token texts need no encoding to be checked
        return None
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
MAX_MESSAGE_ID_CHARS = 64
MessageId = Annotated[str, Field(min_length=1, max_length=MAX_MESSAGE_ID_CHARS)]


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

    cpu_count: int | None = Field(None, description="CPUs of the worker's machine.")
    memory_bytes: int | None = Field(None, description="Memory of the worker's machine.")
    gpus: list[str] = Field(default_factory=list, description="GPU names.")


class ChatTurn(BaseModel):
    """One turn of the conversation a worker renders into a prompt.

    Protocol 3: an assistant turn may carry the ``tool_calls`` it made, and a ``tool`` turn is the result
    of the call ``tool_call_id``.
    """

    role: Role = Field(description="Who said it.")
    content: str = Field(description="What was said.")
    tool_calls: list[ToolCall] | None = Field(
        None, description="Protocol 3: the calls an assistant turn made."
    )
    tool_call_id: str | None = Field(
        None, description="Protocol 3: for a `tool` turn, the call whose result it is."
    )


class WorkerCapabilities(BaseModel):
    """What a worker's backend can honour beyond plain sampling (protocol 3; older workers: nothing).

    The server refuses a request that needs a capability some worker of the model lacks, rather than
    have that worker silently answer a different question.
    """

    model_config = ConfigDict(extra="ignore")

    structured_output: bool = Field(
        False, description="`response_format` is enforced: the answer is constrained to the JSON schema."
    )
    tools: bool = Field(False, description="The backend takes `tools`, `tool_choice` and tool turns.")
    logprobs: bool = Field(False, description="The backend returns token log-probabilities.")
    max_top_logprobs: int = Field(
        default=0, ge=0, description="Most alternatives per token the backend returns."
    )
    frequency_penalty: bool = Field(False, description="The backend takes a frequency penalty.")
    presence_penalty: bool = Field(False, description="The backend takes a presence penalty.")
    unenforced_schema_keywords: list[str] = Field(
        default_factory=list,
        description="JSON-schema keywords the backend's grammar does not enforce "
        "(see oasst_shared.schema_keywords).",
    )
    tokenize: bool = Field(
        False,
        description="Protocol 4: the worker answers `tokenize` and `detokenize` frames with its backend's "
        "tokenizer (the server counts prompts before it queues them).",
    )
    prompt_overhead_bytes: int | None = Field(
        None,
        ge=0,
        description="Protocol 4: the most UTF-8 bytes the worker's chat template adds to the text of a system "
        "prompt and one turn. A prompt has at most its text's bytes plus this plus 8 tokens "
        "(oasst_shared.token_bounds): the server asks for a count only when that bound is over the limit.",
    )
    continue_answer: bool = Field(
        False,
        description="Protocol 5: the worker continues a `work` frame's `answer_prefix` (the start of an answer "
        "an earlier worker generated before it was lost) instead of starting the answer over.",
    )

    @classmethod
    def common(cls, all_capabilities: list[WorkerCapabilities]) -> WorkerCapabilities:
        """What every one of several workers can do."""
        if not all_capabilities:
            return cls()
        return cls(
            structured_output=all(c.structured_output for c in all_capabilities),
            tools=all(c.tools for c in all_capabilities),
            logprobs=all(c.logprobs for c in all_capabilities),
            max_top_logprobs=min(c.max_top_logprobs for c in all_capabilities),
            frequency_penalty=all(c.frequency_penalty for c in all_capabilities),
            presence_penalty=all(c.presence_penalty for c in all_capabilities),
            unenforced_schema_keywords=sorted(
                {k for c in all_capabilities for k in c.unenforced_schema_keywords}
            ),
            tokenize=all(c.tokenize for c in all_capabilities),
            prompt_overhead_bytes=_most(c.prompt_overhead_bytes for c in all_capabilities),
        )


def _conversation_problem(texts: list[str]) -> str | None:
    for text in texts:
        problem = text_problem(text)
        if problem is not None:
            return f"the conversation's {problem}"
    return None


class PromptConversation(BaseModel):
    """A conversation as a work frame carries it, to be tokenized as the prompt the worker renders from
    it (protocol 4): its chat template, the tools it lists where the template does not, the generation
    prompt. Nothing is dropped or cut: the whole conversation is rendered."""

    model_config = ConfigDict(extra="forbid")

    thread: list[ChatTurn] = Field(min_length=1, description="The turns, oldest first.")
    system_prompt: str | None = Field(None, description="A system prompt to render before the thread.")
    tools: list[ToolDefinition] | None = Field(None, description="The tools offered, as in `work`.")
    tool_choice: ToolChoice | None = Field(None, description="As in `work`.")

    @model_validator(mode="after")
    def _text_is_valid(self) -> PromptConversation:
        problem = _conversation_problem([t.content for t in self.thread] + [self.system_prompt or ""])
        if problem is not None:
            raise ValueError(problem)
        return self


class TokenizeInput(BaseModel):
    """One thing to tokenize (protocol 4): a ``text`` as it is, or a ``conversation`` as its prompt."""

    model_config = ConfigDict(extra="forbid")

    text: SafeText | None = Field(
        None,
        description="A text, tokenized as the backend tokenizes a raw prompt (with the special tokens it "
        "adds to one, such as BOS).",
    )
    conversation: PromptConversation | None = Field(
        None, description="A conversation, tokenized as the prompt the worker renders from it."
    )

    @model_validator(mode="after")
    def _one_of(self) -> TokenizeInput:
        if (self.text is None) == (self.conversation is None):
            raise ValueError("give exactly one of text and conversation")
        return self


def _most(values: Iterable[int | None]) -> int | None:
    """The largest of ``values``; None if any is unknown."""
    known = list(values)
    return None if any(v is None for v in known) else max(v for v in known if v is not None)


# ---------------------------------------------------------------- worker -> server


class ServableModel(BaseModel):
    """A model config a worker can switch to (protocol 6), with what a switch to it costs there."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    config: ModelConfig = Field(description="The model config, as the worker's registry has it.")
    memory_bytes: int | None = Field(
        None, ge=0, description="Memory the loaded model takes on this worker, where it is known."
    )
    load_seconds: float | None = Field(
        None,
        ge=0,
        le=86_400,
        description="How long its last load took on this worker (quantizing included), where it was loaded.",
    )


class WorkerInfo(_Frame):
    """The worker's first frame: what it serves and how much at once."""

    type: Literal["worker_info"] = "worker_info"
    model_config_: ModelConfig = Field(
        alias="model_config",
        description="The model the worker serves; workers are interchangeable when its `name` matches.",
    )
    max_parallel_requests: int = Field(
        ge=1, le=1024, description="Jobs the worker runs at once; the server sends no more than this."
    )
    backend_kind: BackendKind = Field(
        description="Which kind of text-generation backend the worker relays to."
    )
    worker_version: str = Field("unknown", description="The worker package's version, for the operator.")
    hardware: Hardware = Field(
        default_factory=Hardware, description="What the worker runs on, for the operator."
    )
    capabilities: WorkerCapabilities = Field(
        default_factory=WorkerCapabilities,
        description="Protocol 3: what the backend can honour beyond plain sampling.",
    )
    backend_model_id: str | None = Field(
        None,
        max_length=256,
        description="Protocol 3: the model the backend says it serves (TGI and CPU `/info` `model_id`, "
        "the OpenAI-style `/v1/models` id); null where it does not tell.",
    )
    backend_model_revision: str | None = Field(
        None,
        max_length=256,
        description="Protocol 3: the model's revision or file hash where the backend tells it (TGI "
        "`model_sha`; the bundled CPU backend's SHA-256 of its GGUF file). Compliance checks compare only "
        "workers whose model id and revision agree.",
    )
    backend_version: str | None = Field(
        None,
        max_length=256,
        description="Protocol 3: the backend's software build where it tells it (TGI `version` and `sha`, "
        "the CPU backend's version and llama.cpp version); greedy output repeats exactly within one build.",
    )
    servable: list[ServableModel] = Field(
        default_factory=list,
        max_length=MAX_SERVABLE_MODELS,
        description="Protocol 6: the model configs this worker can switch its backend to (`model_config` "
        "among them); empty: the worker serves `model_config` only and is never told to switch.",
    )
    loaded: bool = Field(
        True,
        description="Protocol 6: false when the backend holds no model (after an `unload_model`): the worker "
        "takes no work until it is told to load one; `model_config` is the model it last served.",
    )

    model_config = ConfigDict(extra="forbid", populate_by_name=True, protected_namespaces=())

    @model_validator(mode="after")
    def _servable_names_are_unique(self) -> WorkerInfo:
        names = [s.config.name for s in self.servable]
        if len(set(names)) != len(names):
            raise ValueError("servable lists a model config twice")
        return self


class Pong(_Frame):
    type: Literal["pong"] = "pong"
    ping_id: str = Field(description="The `ping_id` of the ping answered.")
    free_slots: int = Field(
        ge=0, description="Jobs the worker can take now (0 while draining or while its backend is unhealthy)."
    )
    backend_healthy: bool = Field(True, description="Whether the backend answered its last health check.")
    backend_queue_length: int | None = Field(
        None, description="Requests waiting in the backend, where the backend tells."
    )
    kv_cache_free_tokens: int | None = Field(
        None, description="Free KV-cache tokens in the backend, where the backend tells."
    )


class Token(_Frame):
    type: Literal["token"] = "token"
    message_id: MessageId = Field(description="The message being generated.")
    text: SafeText = Field(
        description="The text of this token (never part of a stop sequence: those are held back)."
    )
    token_id: int | None = Field(None, description="The backend's token id, where known.")
    logprob: float | None = Field(None, description="The token's log-probability, where known.")
    logprobs: list[TokenLogprob] | None = Field(
        None,
        description="Protocol 3, when the work asked for logprobs: the backend tokens whose text this frame "
        "carries (a stop-sequence hold-back may release several at once, or text a later frame completes).",
    )


class TokenBatch(_Frame):
    """Several tokens, in order, possibly of several messages (protocol 2).

    A worker sends one when tokens queue up faster than it sends frames: the server handles it as
    the same tokens sent one frame each.
    """

    type: Literal["token_batch"] = "token_batch"
    tokens: list[Token] = Field(
        min_length=1,
        description="The tokens, in the order they were generated; they may belong to several messages.",
    )


class GeneratedText(_Frame):
    type: Literal["generated_text"] = "generated_text"
    message_id: MessageId = Field(description="The message that finished.")
    text: SafeText = Field(description="The whole answer: the concatenation of the streamed token texts.")
    finish_reason: FinishReason = Field(description="Why generation stopped; `cancelled` after a `cancel`.")
    generated_tokens: int = Field(ge=0, description="Tokens generated.")
    prompt_tokens: int | None = Field(
        default=None, ge=0, description="Tokens in the rendered prompt, where the backend can count them."
    )
    tool_calls: list[ToolCall] | None = Field(
        None,
        description="Protocol 3: the answer is these calls (its text is then empty); their JSON arguments "
        "match the called tool's parameters where the backend constrained them.",
    )
    prefix_tokens: int | None = Field(
        None,
        ge=0,
        description="Protocol 5, for a work with an `answer_prefix`: the prefix's tokens as the backend counts "
        "them. `text` and `generated_tokens` are then this worker's part only, after the prefix; "
        "`prompt_tokens` does not count the prefix.",
    )
    cached_tokens: int | None = Field(
        None,
        ge=0,
        description="Protocol 5: the prompt tokens the backend served from its prefix cache, where it tells "
        "(the bundled CPU backend); at most `prompt_tokens`.",
    )


class Embeddings(_Frame):
    """The result of an :class:`EmbedWork`: one vector per input, in input order.

    Protocol 4: after :class:`EmbeddingsPart` frames, it carries only the vectors after theirs."""

    type: Literal["embeddings"] = "embeddings"
    message_id: MessageId = Field(description="The embedding request that finished.")
    embeddings: list[list[float]] = Field(
        min_length=1,
        description="One vector per input, in input order (after `embeddings_part` frames: the last ones).",
    )
    prompt_tokens: int = Field(ge=0, description="Tokens in all inputs together.")


class EmbeddingsPart(_Frame):
    """Protocol 4: vectors of an embedding result too large for one frame, in input order.

    The parts of a result come in order, then the :class:`Embeddings` frame with the vectors after
    theirs; together they hold exactly one vector per input, all of one dimension
    (at most :data:`MAX_EMBEDDING_DIMENSION`). :func:`embeddings_frames` cuts a result into them.
    """

    type: Literal["embeddings_part"] = "embeddings_part"
    message_id: MessageId = Field(description="The embedding request.")
    start: int = Field(
        ge=0, description="The index of the input whose vector comes first: the vectors sent before it."
    )
    embeddings: list[list[float]] = Field(min_length=1, description="The vectors, in input order.")


class WorkerError(_Frame):
    """A job failed at the worker. ``retryable`` tells the server another worker may succeed.

    ``backend_unavailable`` (protocol 3): the backend refused before doing the work (no free slot,
    connection refused, a 5xx), which is not the message's fault. The server re-queues the message
    without counting the attempt and gives this worker no work until its pongs report a healthy backend.

    ``backend_died`` (protocol 4): the backend died while it ran the job; the server counts it against
    the message (poison detection), and the worker takes no work until its backend is healthy again.

    ``request_refused`` (protocol 4): the backend judged the request invalid; the message fails as the
    request's fault (a 400 on ``/v1``), not as a server error. Both are written only when true
    (:func:`dump_frame` leaves a false one out), so the frame reads the same to a server of any version.
    """

    type: Literal["error"] = "error"
    message_id: MessageId | None = Field(
        None, description="The failed job, or null for a problem of the worker itself (logged by the server)."
    )
    error: SafeText = Field(
        max_length=MAX_ERROR_CHARS,
        description="What went wrong, for the operator and, when final, the user.",
    )
    retryable: bool = Field(
        False,
        description="True: the server puts the message back in the queue (up to its attempt limit). False: the message fails with this error.",
    )
    backend_unavailable: bool = Field(
        False,
        description="Protocol 3: the backend refused before doing the work (no slot, connection refused, a "
        "5xx); the message is re-queued without counting the attempt.",
    )
    backend_died: bool = Field(
        False,
        description="Protocol 4: the backend's connection broke while it ran this job and its health check "
        "then failed: it died, maybe of this message. The server counts it against the message and fails "
        "the message after `max_backend_deaths` instead of sending it to another backend.",
    )
    request_refused: bool = Field(
        False,
        description="Protocol 4: the backend judged the request itself invalid (HTTP 400/413/422, a "
        "validation error): the message fails as the request's fault (state `refused`; a 400 on `/v1`) "
        "and is not tried elsewhere. Written only when true.",
    )


class Drain(_Frame):
    """The worker finishes its in-flight work and takes nothing new."""

    type: Literal["drain"] = "drain"


SwitchStep = Literal["draining", "unloading", "quantizing", "loading", "starting", "ready", "failed"]


class ModelSwitch(_Frame):
    """A step of a switch the server asked for with :class:`LoadModel` or :class:`UnloadModel` (protocol
    6). ``ready`` and ``failed`` are followed by a :class:`WorkerInfo` saying what the worker serves now;
    except a ``failed`` that refuses a switch asked for while another runs: the running switch's own
    ``worker_info`` follows it."""

    type: Literal["model_switch"] = "model_switch"
    request_id: MessageId = Field(description="The `request_id` of the `load_model` or `unload_model`.")
    model_config_name: str = Field(
        max_length=256, description="The model config loaded (or, for an unload, the one unloaded)."
    )
    step: SwitchStep = Field(description="What the worker does now.")
    tensors_done: int | None = Field(None, ge=0, description="Quantizing: tensors written so far.")
    tensors_total: int | None = Field(None, ge=0, description="Quantizing: tensors in all.")
    error: SafeText | None = Field(
        None, max_length=MAX_ERROR_CHARS, description="Step `failed`: why (the worker serves what it did)."
    )


class Tokenized(_Frame):
    """The answer to a :class:`Tokenize` (protocol 4): one count per input, in order, or an ``error``."""

    type: Literal["tokenized"] = "tokenized"
    request_id: MessageId = Field(description="The `request_id` of the `tokenize` answered.")
    counts: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list, description="Tokens of each input, in order (empty with an error)."
    )
    prompt_bytes: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list,
        description="UTF-8 bytes of the text each count is of: for a conversation, of the rendered prompt "
        "(what its chat template adds is the difference to its turns' text).",
    )
    token_ids: list[list[int]] | None = Field(
        None, description="The token ids of each input, when the request was not for counts only."
    )
    error: SafeText | None = Field(
        None,
        max_length=MAX_ERROR_CHARS,
        description="Why the worker could not tokenize (no tokenizer at its backend, a timeout, too "
        "large an answer); the counts are then empty.",
    )


class Detokenized(_Frame):
    """The answer to a :class:`Detokenize` (protocol 4): one text per list of ids, or an ``error``."""

    type: Literal["detokenized"] = "detokenized"
    request_id: MessageId = Field(description="The `request_id` of the `detokenize` answered.")
    texts: list[SafeText] = Field(
        default_factory=list, description="The text of each list of token ids, in order."
    )
    error: SafeText | None = Field(
        None, max_length=MAX_ERROR_CHARS, description="Why the worker could not detokenize."
    )


AnyWorkerFrame = (
    WorkerInfo
    | Pong
    | Token
    | TokenBatch
    | GeneratedText
    | Embeddings
    | EmbeddingsPart
    | WorkerError
    | Drain
    | Tokenized
    | Detokenized
    | ModelSwitch
)
WorkerFrame = Annotated[AnyWorkerFrame, Field(discriminator="type")]

# ---------------------------------------------------------------- server -> worker


class Work(_Frame):
    """Generate one assistant message for this conversation."""

    type: Literal["work"] = "work"
    message_id: str = Field(description="The assistant message to generate.")
    chat_id: str | None = Field(
        None, description="The chat it belongs to; null for API requests without a chat."
    )
    model_config_name: str = Field(description="The model config the message asked for.")
    thread: list[ChatTurn] = Field(
        min_length=1, description="The conversation so far, oldest turn first, ending with the user's turn."
    )
    system_prompt: str | None = Field(None, description="A system prompt to render before the thread.")
    sampling_parameters: SamplingParameters = Field(
        default_factory=SamplingParameters,
        description="How to sample; `max_new_tokens` is further capped by the model's total length.",
    )
    # A raw prompt bypasses chat-template rendering (the /v1/completions path).
    raw_prompt: str | None = None
    attempt: int = Field(
        default=1,
        ge=1,
        description="1 for the first try; higher when the message is retried after a lost worker or a retryable error.",
    )
    tools: list[ToolDefinition] | None = Field(
        None, description="Protocol 3: the tools the answer may call (see oasst_shared.tool_calls)."
    )
    tool_choice: ToolChoice | None = Field(
        None,
        description="Protocol 3: `none`, `auto`, `required` or a named function (OpenAI's `tool_choice`).",
    )
    cut_newest_turn: bool = Field(
        False,
        description="Protocol 4: when the system prompt and the newest turn alone do not fit the model's "
        "input limit, drop the start of the newest turn's text until they do (the chat API's "
        "`chat_prompt_overflow: cut`), instead of failing the message.",
    )
    answer_prefix: str | None = Field(
        None,
        description="Protocol 5, only to workers whose capabilities say `continue_answer`: the start of the "
        "answer, generated by an earlier worker that was lost. The worker puts it after the prompt (no "
        "end-of-turn after it), generates what follows with `max_new_tokens` less the prefix's tokens, and "
        "streams and returns only what follows (see `generated_text.prefix_tokens`).",
    )

    @property
    def needs_protocol_3(self) -> bool:
        return bool(self.tools) or any(t.role == "tool" or t.tool_calls for t in self.thread)

    @model_validator(mode="after")
    def _text_is_valid(self) -> Work:
        texts = [t.content for t in self.thread]
        texts += [self.system_prompt or "", self.raw_prompt or "", self.answer_prefix or ""]
        for text in texts:
            problem = text_problem(text)
            if problem is not None:
                raise ValueError(f"the conversation's {problem}")
        return self


_PROTOCOL_3_WORK_FIELDS = {"tools", "tool_choice"}
_PROTOCOL_4_WORK_FIELDS = {"cut_newest_turn"}
_PROTOCOL_5_WORK_FIELDS = {"answer_prefix"}


def dump_work(work: Work, protocol_version: int) -> str:
    """The work frame as a worker speaking ``protocol_version`` reads it (older ones forbid new fields)."""
    if protocol_version >= CONTINUATION_PROTOCOL_VERSION:
        return dump_frame(work)
    newer = set(_PROTOCOL_5_WORK_FIELDS)
    if protocol_version < TOKENIZE_PROTOCOL_VERSION:
        newer |= _PROTOCOL_4_WORK_FIELDS
    if protocol_version < TOOLS_PROTOCOL_VERSION:
        newer |= _PROTOCOL_3_WORK_FIELDS
    return work.model_dump_json(by_alias=True, exclude=newer)


class EmbedWork(_Frame):
    """Embed each input with the worker's encoder model (workers whose model kind is ``embedding``)."""

    type: Literal["embed"] = "embed"
    message_id: str = Field(description="The embedding request.")
    model_config_name: str = Field(description="The encoder model config the request asked for.")
    inputs: list[SafeText] = Field(min_length=1, max_length=2048, description="The texts to embed.")
    attempt: int = Field(default=1, ge=1, description="1 for the first try; higher on a retry.")


class Cancel(_Frame):
    type: Literal["cancel"] = "cancel"
    message_id: str = Field(
        description="The job to stop: the worker closes its backend stream and answers with `generated_text` (finish reason `cancelled`) carrying the text so far."
    )


class Ping(_Frame):
    type: Literal["ping"] = "ping"
    ping_id: str = Field(description="Echoed in the `pong`.")


class Tokenize(_Frame):
    """Tokenize each input with the worker's backend (protocol 4; workers reporting the ``tokenize``
    capability). Answered by one :class:`Tokenized` with the same ``request_id``. The server counts
    prompts with it before it queues them; with ``counts_only`` false the answer lists the token ids
    too, as a ``/tokenize`` API (vLLM's) answers."""

    type: Literal["tokenize"] = "tokenize"
    request_id: MessageId = Field(description="Echoed in the answer.")
    inputs: list[TokenizeInput] = Field(
        min_length=1, max_length=MAX_TOKENIZE_INPUTS, description="What to tokenize, in order."
    )
    counts_only: bool = Field(True, description="True: the counts only; false: the token ids too.")


class Detokenize(_Frame):
    """Turn lists of token ids back into text with the worker's backend (protocol 4). Answered by one
    :class:`Detokenized` with the same ``request_id``."""

    type: Literal["detokenize"] = "detokenize"
    request_id: MessageId = Field(description="Echoed in the answer.")
    token_ids: list[list[int]] = Field(
        min_length=1, max_length=MAX_TOKENIZE_INPUTS, description="The lists of token ids, in order."
    )


class LoadModel(_Frame):
    """Serve ``model_config_name`` (one of the worker's ``servable``) instead of the model it serves now
    (protocol 6). The worker drains, unloads, loads, reports :class:`ModelSwitch` steps and a fresh
    :class:`WorkerInfo`; if the load fails it serves the previous model again."""

    type: Literal["load_model"] = "load_model"
    request_id: MessageId = Field(description="Echoed in the `model_switch` frames.")
    model_config_name: str = Field(max_length=256, description="The servable model config to load.")


class UnloadModel(_Frame):
    """Free the backend's memory (protocol 6): the worker drains, unloads its model and answers with a
    :class:`WorkerInfo` whose ``loaded`` is false; it takes no work until a :class:`LoadModel`."""

    type: Literal["unload_model"] = "unload_model"
    request_id: MessageId = Field(description="Echoed in the `model_switch` frames.")


class UpgradeRequired(_Frame):
    """Sent before closing a worker whose protocol version the server no longer speaks."""

    type: Literal["upgrade_required"] = "upgrade_required"
    server_protocol_version: int = Field(description="The newest protocol version the server speaks.")
    min_supported_version: int = Field(description="The oldest protocol version the server accepts.")
    detail: str = Field(description="What to upgrade, in words.")


AnyServerFrame = (
    Work | EmbedWork | Cancel | Ping | UpgradeRequired | Tokenize | Detokenize | LoadModel | UnloadModel
)
ServerFrame = Annotated[AnyServerFrame, Field(discriminator="type")]

_worker_frame_adapter: TypeAdapter[WorkerFrame] = TypeAdapter(WorkerFrame)
_server_frame_adapter: TypeAdapter[ServerFrame] = TypeAdapter(ServerFrame)


def parse_worker_frame(data: str | bytes) -> AnyWorkerFrame:
    try:
        return _worker_frame_adapter.validate_json(data)
    except ValidationError as exc:
        raise ProtocolError(_short_error(exc)) from None


def parse_server_frame(data: str | bytes) -> AnyServerFrame:
    try:
        return _server_frame_adapter.validate_json(data)
    except ValidationError as exc:
        raise ProtocolError(_short_error(exc)) from None


def dump_frame(frame: BaseModel) -> str:
    if isinstance(frame, WorkerError):
        # Protocol 4's fields only where they say something: the frame reads the same to any server.
        unsaid = {name for name in _PROTOCOL_4_ERROR_FIELDS if not getattr(frame, name)}
        return frame.model_dump_json(by_alias=True, exclude_none=False, exclude=unsaid)
    if isinstance(frame, GeneratedText):
        # Protocol 5's fields only where they say something: such a result reads the same to any server.
        unsaid = {name for name in _PROTOCOL_5_RESULT_FIELDS if getattr(frame, name) is None}
        return frame.model_dump_json(by_alias=True, exclude_none=False, exclude=unsaid)
    return frame.model_dump_json(by_alias=True, exclude_none=False)


_PROTOCOL_4_ERROR_FIELDS = ("backend_died", "request_refused")
_PROTOCOL_5_RESULT_FIELDS = ("prefix_tokens", "cached_tokens")


def embeddings_frames(
    message_id: str, vectors: list[list[float]], prompt_tokens: int
) -> list[EmbeddingsPart | Embeddings]:
    """An embedding result as frames that each fit :data:`MAX_FRAME_BYTES`: one :class:`Embeddings`
    frame when it fits, else :class:`EmbeddingsPart` frames and then the :class:`Embeddings` frame with
    the last vectors (protocol 4). Cut by the most bytes a float may take, so nothing is measured."""
    dimension = max(len(v) for v in vectors)
    per_vector = dimension * _MAX_FLOAT_JSON_BYTES + 3  # brackets and the comma after it
    size = max(1, (MAX_FRAME_BYTES - _FRAME_ENVELOPE_BYTES) // per_vector)
    frames: list[EmbeddingsPart | Embeddings] = [
        EmbeddingsPart(message_id=message_id, start=start, embeddings=vectors[start : start + size])
        for start in range(0, len(vectors) - size, size)
    ]
    last = len(frames) * size
    frames.append(Embeddings(message_id=message_id, embeddings=vectors[last:], prompt_tokens=prompt_tokens))
    return frames


# A JSON string token (escapes included), or a bracket, a brace, a colon: enough to walk an object's
# top level without parsing what lies below it.
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[{}\[\]:]')
# The longest string token worth decoding: a key or a message id, every character escaped (\uXXXX).
_MAX_TOKEN_CHARS = 256 * 6 + 2


def top_level_strings(data: str | bytes, keys: Collection[str]) -> dict[str, str]:
    """The string values of ``keys`` at the top level of a JSON object that may not parse (too deep for
    a parser, or refused by the schema), each at most :data:`MAX_MESSAGE_ID_CHARS` long.

    One pass over the text (a frame is at most :data:`MAX_FRAME_BYTES`) that decodes nothing but short
    strings at the top level: the frame that failed to parse is not parsed again."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    if not text.lstrip().startswith("{"):
        return {}
    found: dict[str, str] = {}
    depth = 0
    name: str | None = None  # the last string token at the top level (a key, if a colon follows)
    key: str | None = None  # the key whose value is the next token
    for match in _JSON_TOKEN.finditer(text):
        token = match.group()
        if token == ":":
            key, name = (name if depth == 1 else None), None
            continue
        if token[0] == '"' and depth == 1:
            value = _json_string(token) if len(token) <= _MAX_TOKEN_CHARS else None
            if key is not None and key in keys and key not in found and value is not None:
                # Its value only if nothing (a number, a literal) stands between the colon and it.
                between = text[text.rfind(":", 0, match.start()) + 1 : match.start()]
                if not between.strip() and len(value) <= MAX_MESSAGE_ID_CHARS:
                    found[key] = value
            name = value
        elif token in ("{", "["):
            depth += 1
        elif token in ("}", "]"):
            depth -= 1
            if depth <= 0:
                break
        key = None
    return found


def _json_string(token: str) -> str | None:
    try:
        value = json.loads(token)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def _short_error(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False, include_input=False)
    parts = [f"{'.'.join(str(p) for p in e['loc']) or '<frame>'}: {e['msg']}" for e in errors[:3]]
    return "; ".join(parts)
