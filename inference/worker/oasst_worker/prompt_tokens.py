"""How many tokens a prompt holds, without asking the backend when the answer does not depend on it.

Counting exactly is a round trip to the backend's tokenizer, on the way to the first token. Most
prompts do not need it: no tokenizer makes more tokens of a text than :func:`token_bound`
(``oasst_shared.token_bounds``, which the server uses too), so a prompt whose bound fits the input limit
fits, and a bound that leaves the requested answer whole leaves it whole. The exact count is then only for the usage report: :class:`PromptCount` asks for it
once the answer's stream has ended, unless the backend reported it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from oasst_shared.chat_template import approximate_token_count
from oasst_shared.token_bounds import ADDED_TOKENS, token_bound

__all__ = ["ADDED_TOKENS", "PromptCount", "token_bound"]


class PromptCount:
    """A prompt's token count for the usage report: known already, reported by the backend, or asked of
    it when the report is built.

    ``known`` None: the count is not known (only its bound was needed); ``count(text)`` is asked in
    :meth:`result`, once the answer's stream has ended, unless the backend reported the count itself
    meanwhile. Not while the answer streams: a second request to a backend with one slot (a llama.cpp
    server) while its stream is open was seen to end that stream without a finish reason.
    """

    def __init__(self, text: str, known: int | None, count: Callable[[str], Awaitable[int]]) -> None:
        self._text = text
        self._tokens = known
        self._count = count

    def reported(self, tokens: int) -> None:
        """The backend's own count, which beats ours."""
        self._tokens = tokens

    async def result(self, wait: float | None = None) -> int:
        """The count; if the backend has not given it within ``wait`` seconds, the estimate the worker
        uses when the backend cannot count."""
        if self._tokens is None:
            try:
                self._tokens = await asyncio.wait_for(self._count(self._text), wait)
            except asyncio.TimeoutError:
                self._tokens = approximate_token_count(self._text)
        return self._tokens
