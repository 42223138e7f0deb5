"""Answering the server's ``tokenize`` and ``detokenize`` frames (protocol 4) with the backend's tokenizer.

The server counts a prompt before it queues it, so that one too long for the model is refused (or, on
the chat API, known to be cut) at submission instead of failing on a worker: it asks a worker of the
model, whose backend holds the model's own tokenizer. A text is tokenized as it is; a conversation as
the prompt this worker renders from it for a work frame (:meth:`PromptBuilder.render_whole`: the same
template, tools and system turn), so the server's numbers are the ones the worker would find.

Bounded: at most ``max_concurrent`` requests reach the backend at once (the others wait their turn), each
answered within ``timeout`` seconds, and an answer larger than a frame is an error answer. Failures are
answers too (``error``): the server then does without the count.
"""

from __future__ import annotations

import asyncio

from loguru import logger

from oasst_shared.protocol import (
    MAX_ERROR_CHARS,
    Detokenize,
    Detokenized,
    Tokenize,
    Tokenized,
    TokenizeInput,
    dump_frame,
    fits_in_frame,
)
from oasst_shared.token_bounds import utf8_bytes
from oasst_worker.backends.protocols import GenerationBackend
from oasst_worker.prompting import PromptBuilder

DEFAULT_TIMEOUT = 10.0  # seconds: the backend's own client gives up after as long
DEFAULT_MAX_CONCURRENT = 4


class CannotTokenize(Exception):
    """The backend cannot answer (no tokenizer endpoint, an error): the answer's ``error``."""


class PromptTokenizer:
    def __init__(
        self,
        prompts: PromptBuilder,
        backend: GenerationBackend,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
    ) -> None:
        self._prompts = prompts
        self._backend = backend
        self._timeout = timeout
        self._turns = asyncio.Semaphore(max_concurrent)

    def prompt_overhead(self) -> int | None:
        """What the worker reports as ``prompt_overhead_bytes`` (once its template is resolved)."""
        return self._prompts.template_overhead()

    async def answer(self, frame: Tokenize | Detokenize) -> Tokenized | Detokenized:
        """The answer to ``frame``; never raises but for cancellation."""
        try:
            async with asyncio.timeout(self._timeout):
                async with self._turns:
                    if isinstance(frame, Tokenize):
                        return await self._tokenize(frame)
                    return await self._detokenize(frame)
        except TimeoutError:
            error = f"the backend did not answer within {self._timeout:g}s"
        except CannotTokenize as exc:
            error = str(exc)
        except Exception as exc:  # a template that fails to render, a bug: this request fails alone
            logger.opt(exception=exc).warning("{} {} failed", frame.type, frame.request_id)
            error = f"{type(exc).__name__}: {exc}"
        error = error[:MAX_ERROR_CHARS]
        if isinstance(frame, Tokenize):
            return Tokenized(request_id=frame.request_id, error=error)
        return Detokenized(request_id=frame.request_id, error=error)

    async def _tokenize(self, frame: Tokenize) -> Tokenized:
        counts: list[int] = []
        sizes: list[int] = []
        ids: list[list[int]] = []
        for item in frame.inputs:
            text = self._text(item)
            sizes.append(utf8_bytes(text))
            if frame.counts_only:
                count = await self._backend.count_tokens(text)
                if count is None:
                    raise CannotTokenize("the backend cannot count tokens")
                counts.append(count)
            else:
                token_ids = await self._backend.token_ids(text)
                if token_ids is None:
                    raise CannotTokenize("the backend cannot list token ids")
                ids.append(token_ids)
                counts.append(len(token_ids))
        answer = Tokenized(
            request_id=frame.request_id,
            counts=counts,
            prompt_bytes=sizes,
            token_ids=None if frame.counts_only else ids,
        )
        if not frame.counts_only and not fits_in_frame(dump_frame(answer)):
            raise CannotTokenize("the token ids are more than one frame carries: ask for fewer texts")
        return answer

    async def _detokenize(self, frame: Detokenize) -> Detokenized:
        texts: list[str] = []
        for token_ids in frame.token_ids:
            text = await self._backend.detokenize(token_ids)
            if text is None:
                raise CannotTokenize("the backend cannot detokenize")
            texts.append(text)
        answer = Detokenized(request_id=frame.request_id, texts=texts)
        if not fits_in_frame(dump_frame(answer)):
            raise CannotTokenize("the texts are more than one frame carries: ask for fewer")
        return answer

    def _text(self, item: TokenizeInput) -> str:
        if item.conversation is not None:
            return self._prompts.render_whole(item.conversation)
        return item.text or ""
