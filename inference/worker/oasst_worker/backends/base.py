"""The interface every text-generation backend adapter implements.

An adapter turns one prompt into an async stream of :class:`StreamedToken` followed by exactly one
:class:`GenerationResult`. Cancelling the consuming task must close the HTTP stream to the backend.
Errors are raised as :class:`BackendError` with ``retryable`` saying whether another worker (or a
later try) may succeed.

Adapters of a Messages API (``takes_messages``) also implement :meth:`Backend.generate_chat_stream`,
which takes the conversation instead of rendered text; encoders implement :meth:`Backend.embed`.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from oasst_shared.protocol import ChatTurn, FinishReason
from oasst_shared.sampling import SamplingParameters


class BackendError(Exception):
    def __init__(self, message: str, *, retryable: bool):
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class StreamedToken:
    text: str
    token_id: int | None = None
    logprob: float | None = None
    special: bool = False


@dataclass(frozen=True)
class GenerationResult:
    text: str
    finish_reason: FinishReason
    generated_tokens: int
    # The backend's own count of the prompt, where it reports one (OpenAI usage).
    prompt_tokens: int | None = None


@dataclass(frozen=True)
class EmbeddingResult:
    vectors: list[list[float]]
    prompt_tokens: int


@dataclass(frozen=True)
class BackendInfo:
    model_id: str | None = None
    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    max_input_length: int | None = None
    max_total_tokens: int | None = None


class Backend(abc.ABC):
    # True when the backend applies the chat template itself: jobs call generate_chat_stream.
    takes_messages: bool = False

    @abc.abstractmethod
    async def info(self) -> BackendInfo: ...

    @abc.abstractmethod
    async def healthy(self) -> bool: ...

    @abc.abstractmethod
    async def count_tokens(self, text: str) -> int | None:
        """The prompt's token count, or None when the backend cannot tell."""

    @abc.abstractmethod
    def generate_stream(
        self, prompt: str, params: SamplingParameters, max_new_tokens: int
    ) -> AsyncGenerator[StreamedToken | GenerationResult, None]: ...

    def generate_chat_stream(
        self, messages: list[ChatTurn], params: SamplingParameters, max_new_tokens: int
    ) -> AsyncGenerator[StreamedToken | GenerationResult, None]:
        raise BackendError("this backend takes rendered prompts, not messages", retryable=False)

    async def embed(self, inputs: list[str]) -> EmbeddingResult:
        raise BackendError("this backend serves no embedding model", retryable=False)

    async def close(self) -> None:  # noqa: B027 - optional hook
        pass
