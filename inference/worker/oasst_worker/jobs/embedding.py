"""The embedding job: answers one :class:`EmbedWork` with one :class:`Embeddings` frame."""

from __future__ import annotations

import asyncio

from loguru import logger

from oasst_shared.model_configs import ModelConfig
from oasst_shared.protocol import Embeddings, EmbedWork, Work, WorkerError
from oasst_worker.backends.protocols import EmbeddingBackend
from oasst_worker.backends.records import BackendError, BackendInfo
from oasst_worker.jobs.base import Send, WrongKindOfWork, backend_failure
from oasst_worker.tokenizing import PromptTokenizer


class EmbeddingJobFactory:
    def __init__(self, backend: EmbeddingBackend, model_config: ModelConfig):
        self.backend = backend
        self.model_config = model_config
        self.backend_info: BackendInfo | None = None  # an encoder does not describe its build
        self.tokenizer: PromptTokenizer | None = None  # the server counts no embedding inputs

    async def prepare(self) -> None:
        return None  # an encoder has no prompt template to resolve

    def create(self, work: Work | EmbedWork) -> EmbeddingJob:
        if not isinstance(work, EmbedWork):
            raise WrongKindOfWork(self.model_config, work)
        return EmbeddingJob(work, backend=self.backend)


class EmbeddingJob:
    def __init__(self, work: EmbedWork, *, backend: EmbeddingBackend):
        self.work = work
        self._backend = backend
        self.cancel_requested = False

    async def run(self, send: Send) -> None:
        message_id = self.work.message_id
        logger.info("message {}: embedding (attempt {})", message_id, self.work.attempt)
        try:
            result = await self._backend.embed(list(self.work.inputs))
        except asyncio.CancelledError:
            if not self.cancel_requested:
                raise
            # The server finishes a cancelled message itself when the worker lets go of it.
            await send(WorkerError(message_id=message_id, error="cancelled", retryable=False))
            return
        except BackendError as exc:
            logger.warning("message {}: embedding failed: {}", message_id, exc)
            await send(backend_failure(message_id, exc))
            return
        logger.info("message {}: embedded {} inputs", message_id, len(result.vectors))
        await send(
            Embeddings(message_id=message_id, embeddings=result.vectors, prompt_tokens=result.prompt_tokens)
        )
