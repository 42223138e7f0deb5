"""What backend adapters yield, return and raise: stream items, results, backend info, :class:`BackendError`.

Frozen dataclasses rather than pydantic models: a :class:`StreamedToken` is built for every generated token,
and these values never leave the worker process (the frames built from them are oasst_shared's models).
"""

from __future__ import annotations

from dataclasses import dataclass

from oasst_shared.logprobs import TokenLogprob
from oasst_shared.protocol import FinishReason
from oasst_shared.tool_calls import ToolCall


class BackendError(Exception):
    """A backend failed; ``retryable`` says whether another worker (or a later try) may succeed.

    ``unavailable``: the backend refused before starting the work (no free slot, connection refused,
    a 5xx before any token). That is not the message's fault: the server re-queues it without counting
    the attempt, and the worker takes no work until its backend's health check passes again.

    ``connection_lost``: the connection broke after the request was sent (reset, closed without an
    answer, a stream cut short). The backend may have died while it ran the request, maybe of it: the
    job asks the backend's health check to tell (a dead backend counts against the message).

    ``refused``: the backend judged the request itself invalid (a 400, 413 or 422, a validation error):
    the request's fault, so it is not retried and its caller is told so (a 4xx, not a server error).
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        unavailable: bool = False,
        connection_lost: bool = False,
        refused: bool = False,
    ):
        super().__init__(message)
        self.refused = refused and not (unavailable or connection_lost)
        self.retryable = (retryable or unavailable or connection_lost) and not self.refused
        self.unavailable = unavailable
        self.connection_lost = connection_lost


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ sets each field through object.__setattr__
class StreamedToken:
    text: str
    token_id: int | None = None
    logprob: float | None = None
    special: bool = False
    # When the work asked for logprobs: this token's entry (with its top alternatives).
    logprobs: TokenLogprob | None = None


@dataclass(frozen=True)
class GenerationResult:
    """The last item of a generation stream."""

    text: str
    finish_reason: FinishReason
    generated_tokens: int
    # The backend's own count of the prompt, where it reports one (OpenAI usage).
    prompt_tokens: int | None = None
    # Backends with native tool support: the calls the answer made.
    tool_calls: list[ToolCall] | None = None
    # Prompt tokens the backend's prefix cache served, where it tells (the bundled CPU backend).
    cached_tokens: int | None = None


@dataclass(frozen=True)
class EmbeddingResult:
    vectors: list[list[float]]
    prompt_tokens: int


@dataclass(frozen=True)
class BackendInfo:
    """What a generation backend tells about its model; None for what it does not tell."""

    model_id: str | None = None
    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    max_input_length: int | None = None
    max_total_tokens: int | None = None
    # The model's revision or file hash, and the backend's build, where told (the worker reports them).
    model_revision: str | None = None
    backend_version: str | None = None
