"""The interface of each kind of backend: :class:`GenerationBackend` and :class:`EmbeddingBackend`.

A generation adapter turns one prompt into an async stream of :class:`StreamedToken` followed by exactly
one :class:`GenerationResult`. Closing the stream (the job uses ``contextlib.aclosing``, and a cancelled
job's task closes it too) must close the HTTP stream to the backend, so the backend stops generating.
Errors are raised as :class:`BackendError` with ``retryable`` saying whether another worker (or a later
try) may succeed. Adapters of a Messages API (``takes_messages``) also implement
:meth:`GenerationBackend.generate_chat_stream`, which takes the conversation instead of rendered text,
and the tools it may call (passed through: their result carries the ``tool_calls``).

Structured output and log-probabilities are asked for in the sampling parameters
(``params.output_schema``, ``params.logprobs``/``params.top_logprobs``); an adapter honours what its
worker reports in :func:`capabilities`.

An embedding adapter answers :meth:`EmbeddingBackend.embed` with one vector per input.

Adapters subclass their protocol explicitly, which gives them its defaults (``takes_messages = False``,
a ``generate_chat_stream`` that refuses, a ``close`` that does nothing).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol

from oasst_shared.protocol import ChatTurn
from oasst_shared.sampling import SamplingParameters
from oasst_shared.tool_calls import ToolChoice, ToolDefinition
from oasst_worker.backends.records import (
    BackendError,
    BackendInfo,
    EmbeddingResult,
    GenerationResult,
    StreamedToken,
)

GenerationStream = AsyncGenerator[StreamedToken | GenerationResult, None]


class BackendBase(Protocol):
    """What the worker needs of any backend: its health, and a way to let go of it."""

    async def healthy(self) -> bool:
        """True when the backend can take a request now; polled every few seconds. Never raises, except
        a non-retryable :class:`BackendError` for a backend that can never become healthy."""
        ...

    async def close(self) -> None:
        """Release clients and connections; once, when the worker exits."""
        return None  # a default for adapters that hold nothing (a body of only a docstring is abstract)


class GenerationBackend(BackendBase, Protocol):
    # True when the backend applies the chat template itself: jobs call generate_chat_stream.
    takes_messages: bool = False

    async def info(self) -> BackendInfo: ...

    async def count_tokens(self, text: str) -> int | None:
        """The prompt's token count, or None when the backend cannot tell."""
        ...

    async def token_ids(self, text: str) -> list[int] | None:
        """The ids of the tokens of ``text`` as a prompt, or None when the backend cannot tell."""
        return None

    async def detokenize(self, token_ids: list[int]) -> str | None:
        """The text of ``token_ids``, or None when the backend cannot tell."""
        return None

    def generate_stream(
        self, prompt: str, params: SamplingParameters, max_new_tokens: int
    ) -> GenerationStream: ...

    def continue_stream(
        self, prompt: str, answer_prefix: str, params: SamplingParameters, max_new_tokens: int
    ) -> GenerationStream:
        """Generate after ``prompt`` and ``answer_prefix``, the start of the answer an earlier generation
        produced (a continuation): by default the two as one prompt."""
        return self.generate_stream(prompt + answer_prefix, params, max_new_tokens)

    def generate_chat_stream(
        self,
        messages: list[ChatTurn],
        params: SamplingParameters,
        max_new_tokens: int,
        *,
        tools: list[ToolDefinition] | None = None,
        tool_choice: ToolChoice | None = None,
    ) -> GenerationStream:
        raise BackendError("this backend takes rendered prompts, not messages", retryable=False)


class EmbeddingBackend(BackendBase, Protocol):
    async def embed(self, inputs: list[str]) -> EmbeddingResult:
        """One vector per input, in order, and the tokens the model ran over."""
        ...
