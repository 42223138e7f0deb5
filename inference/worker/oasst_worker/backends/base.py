"""The interface every text-generation backend adapter implements.

An adapter turns one prompt into an async stream of :class:`StreamedToken` followed by exactly one
:class:`GenerationResult`. Cancelling the consuming task must close the HTTP stream to the backend.
Errors are raised as :class:`BackendError` with ``retryable`` saying whether another worker (or a
later try) may succeed.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from oasst_shared.protocol import FinishReason
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


@dataclass(frozen=True)
class BackendInfo:
    model_id: str | None = None
    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    max_input_length: int | None = None
    max_total_tokens: int | None = None


class Backend(abc.ABC):
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

    async def close(self) -> None:  # noqa: B027 - optional hook
        pass
