"""The generation job: builds the prompt, streams from the backend, sends tokens and the result."""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing

from loguru import logger
from pydantic import ValidationError

from oasst_shared.chat_template import ChatTemplateError
from oasst_shared.model_configs import ModelConfig
from oasst_shared.protocol import EmbedWork, GeneratedText, Token, Work, WorkerError
from oasst_shared.stop_sequences import StopSequenceFilter
from oasst_worker import metrics
from oasst_worker.backends.protocols import GenerationBackend
from oasst_worker.backends.records import BackendError, GenerationResult
from oasst_worker.jobs.base import Send, WrongKindOfWork
from oasst_worker.prompting import PromptBuilder


class GenerationJobFactory:
    """Generation jobs for one model config, sharing one prompt builder."""

    def __init__(self, backend: GenerationBackend, model_config: ModelConfig):
        self.backend = backend
        self.model_config = model_config
        self._prompts = PromptBuilder(model_config, backend)

    async def prepare(self) -> None:
        await self._prompts.prepare()

    def create(self, work: Work | EmbedWork) -> GenerationJob:
        if not isinstance(work, Work):
            raise WrongKindOfWork(self.model_config, work)
        return GenerationJob(
            work, backend=self.backend, prompts=self._prompts, model_config=self.model_config
        )


class GenerationJob:
    def __init__(
        self, work: Work, *, backend: GenerationBackend, prompts: PromptBuilder, model_config: ModelConfig
    ):
        self.work = work
        self._backend = backend
        self._prompts = prompts
        self._config = model_config
        self.cancel_requested = False
        self._text: list[str] = []
        self._generated = 0
        self._prompt_tokens: int | None = None
        self._started = time.monotonic()
        self._first_token_at: float | None = None

    async def run(self, send: Send) -> None:
        logger.info("message {}: generating (attempt {})", self.work.message_id, self.work.attempt)
        metrics.IN_FLIGHT.inc()
        try:
            outcome = await self._run(send)
        finally:
            metrics.IN_FLIGHT.dec()
        metrics.JOBS.labels(outcome).inc()
        if self._first_token_at is not None and self._generated > 1:
            elapsed = time.monotonic() - self._first_token_at
            if elapsed > 0:
                metrics.TOKENS_PER_SECOND.observe((self._generated - 1) / elapsed)

    async def _run(self, send: Send) -> str:
        message_id = self.work.message_id
        try:
            result = await self._generate(send)
        except asyncio.CancelledError:
            if not self.cancel_requested:
                raise
            logger.info("message {} cancelled after {} tokens", message_id, self._generated)
            result = GeneratedText(
                message_id=message_id,
                text="".join(self._text),
                finish_reason="cancelled",
                generated_tokens=self._generated,
                prompt_tokens=self._prompt_tokens,
            )
        except BackendError as exc:
            logger.warning("message {} failed at the backend: {}", message_id, exc)
            error = WorkerError(
                message_id=message_id,
                error=str(exc)[:4000],
                retryable=exc.retryable,
                backend_unavailable=exc.unavailable,
            )
            await send(error)
            return "backend_unavailable" if exc.unavailable else "backend_error"
        except ValidationError as exc:
            # The backend produced text no frame may carry (NUL, a lone surrogate): this message's
            # answer cannot be delivered, and another try would likely produce it again.
            logger.warning(
                "message {}: the backend's text cannot be sent: {}", message_id, exc.errors()[0]["msg"]
            )
            error = WorkerError(
                message_id=message_id,
                error=f"the backend produced text that cannot be sent: {exc.errors()[0]['msg']}",
                retryable=False,
            )
            await send(error)
            return "invalid_text"
        except ChatTemplateError as exc:
            await send(WorkerError(message_id=message_id, error=str(exc), retryable=False))
            return "prompt_error"
        await send(result)
        return "cancelled" if result.finish_reason == "cancelled" else "complete"

    async def _generate(self, send: Send) -> GeneratedText:
        work = self.work
        prompt = await self._prompts.build(work)
        self._prompt_tokens = prompt.tokens
        params = work.sampling_parameters
        max_new_tokens = self._config.cap_max_new_tokens(params.max_new_tokens, prompt.tokens)
        stops = StopSequenceFilter([*params.stop, *self._config.stop_sequences])
        finish_reason = "length"
        if prompt.messages is not None:
            backend_stream = self._backend.generate_chat_stream(prompt.messages, params, max_new_tokens)
        else:
            backend_stream = self._backend.generate_stream(prompt.text, params, max_new_tokens)
        # aclosing: leaving the loop early closes the backend's HTTP stream at once, not at GC time.
        async with aclosing(backend_stream) as stream:
            async for item in stream:
                if self.cancel_requested:
                    # The client's task.cancel() is lost when it lands just as a token arrives
                    # (asyncio.wait_for in the backends then returns the token): the flag still
                    # ends the job at the next token.
                    raise asyncio.CancelledError
                if isinstance(item, GenerationResult):
                    await self._emit(send, stops.flush())
                    finish_reason = item.finish_reason
                    self._generated = max(self._generated, item.generated_tokens)
                    if item.prompt_tokens is not None:  # the backend's own count beats our estimate
                        self._prompt_tokens = item.prompt_tokens
                    break
                self._generated += 1
                if self._first_token_at is None:
                    self._first_token_at = time.monotonic()
                    metrics.TIME_TO_FIRST_TOKEN.observe(self._first_token_at - self._started)
                metrics.TOKENS.inc()
                await self._emit(send, stops.push(item.text))
                if stops.stopped:
                    finish_reason = "stop_sequence"
                    break
        return GeneratedText(
            message_id=work.message_id,
            text="".join(self._text),
            finish_reason=finish_reason,
            generated_tokens=self._generated,
            prompt_tokens=self._prompt_tokens,
        )

    async def _emit(self, send: Send, text: str) -> None:
        if text:
            self._text.append(text)
            await send(Token(message_id=self.work.message_id, text=text))
