"""The embedding job: answers one :class:`EmbedWork` with its vectors: one :class:`Embeddings` frame, or,
for a result too large for one frame, :class:`EmbeddingsPart` frames and then the :class:`Embeddings`
frame with the last vectors (protocol 4)."""

from __future__ import annotations

import asyncio

from loguru import logger

from oasst_shared.model_configs import ModelConfig
from oasst_shared.protocol import (
    MAX_EMBEDDING_DIMENSION,
    Embeddings,
    EmbeddingsPart,
    EmbedWork,
    Work,
    WorkerError,
    embeddings_frames,
)
from oasst_worker.backends.protocols import EmbeddingBackend
from oasst_worker.backends.records import BackendError, BackendInfo, EmbeddingResult
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
            frames = self._frames(result)
            if isinstance(frames, WorkerError):
                await send(frames)
                return
            for frame in frames:  # a cancel between parts ends the result with an error
                await send(frame)
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
        logger.info(
            "message {}: embedded {} inputs ({} frames)", message_id, len(result.vectors), len(frames)
        )

    def _frames(self, result: EmbeddingResult) -> list[EmbeddingsPart | Embeddings] | WorkerError:
        """The frames of the result, or the error that replaces a result the protocol cannot carry."""
        message_id = self.work.message_id
        dimension = max((len(v) for v in result.vectors), default=0)
        if len(result.vectors) != len(self.work.inputs) or not 0 < dimension <= MAX_EMBEDDING_DIMENSION:
            error = (
                f"the encoder returned {len(result.vectors)} vectors of up to {dimension} dimensions for "
                f"{len(self.work.inputs)} inputs (the protocol carries up to {MAX_EMBEDDING_DIMENSION})"
            )
            logger.error("message {}: {}", message_id, error)
            return WorkerError(message_id=message_id, error=error, retryable=False)
        return embeddings_frames(message_id, result.vectors, result.prompt_tokens)
