"""The job interface: :class:`Job` (one unit of server work) and :class:`JobFactory` (the jobs of one kind).

A worker serves one model config, of one kind: a generation worker makes a generation job of every
``work`` frame, an embedding worker an embedding job of every ``embed`` frame. Work of the other kind is a
routing mistake of the server, which the worker answers with a final error (:class:`WrongKindOfWork`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from pydantic import BaseModel

from oasst_shared.model_configs import ModelConfig
from oasst_shared.protocol import MAX_ERROR_CHARS, EmbedWork, Work, WorkerError
from oasst_shared.token_frames import TokenFrame
from oasst_worker.backends.protocols import BackendBase
from oasst_worker.backends.records import BackendError, BackendInfo
from oasst_worker.tokenizing import PromptTokenizer

# Writes one frame to the server (a token as a plain tuple, any other frame as its protocol model);
# raises websockets' ConnectionClosed when the connection is gone.
Send = Callable[[TokenFrame | BaseModel], Awaitable[None]]

# Seconds a health check may take to say whether a backend whose connection broke is still alive.
DEATH_CHECK_TIMEOUT = 5.0


class Job(Protocol):
    # Set with the task's cancellation: a cancellation can be lost (see GenerationJob), the flag cannot.
    cancel_requested: bool

    @property
    def work(self) -> Work | EmbedWork: ...

    async def run(self, send: Send) -> None:
        """Do the work and send its frames: tokens and a result, or one error. Raises only when the
        connection is gone (ConnectionClosed), on cancellation without ``cancel_requested``, and on bugs."""
        ...


class JobFactory(Protocol):
    @property
    def backend(self) -> BackendBase: ...

    @property
    def model_config(self) -> ModelConfig: ...

    @property
    def backend_info(self) -> BackendInfo | None:
        """What the backend said about its model at :meth:`prepare` (None: nothing)."""
        ...

    @property
    def tokenizer(self) -> PromptTokenizer | None:
        """Answers the server's tokenize frames (None: this kind of worker does not)."""
        ...

    async def prepare(self) -> None:
        """Once per connection, before the worker describes itself to the server."""
        ...

    def create(self, work: Work | EmbedWork) -> Job:
        """The job for ``work``; raises :class:`WrongKindOfWork` for work of the other kind."""
        ...


class WrongKindOfWork(Exception):
    def __init__(self, config: ModelConfig, work: Work | EmbedWork) -> None:
        wanted = "embedding" if isinstance(work, EmbedWork) else "generation"
        super().__init__(f"worker serves the {config.kind} model {config.name}, not {wanted} work")


def backend_failure(message_id: str, exc: BackendError, *, died: bool = False) -> WorkerError:
    """The frame that tells the server a job's backend failed, and whether it may be retried elsewhere;
    ``died``: the backend died while it ran the job (:func:`backend_died`), which counts against it."""
    error = f"the backend died while it ran this request ({exc})" if died else str(exc)
    return WorkerError(
        message_id=message_id,
        error=error[:MAX_ERROR_CHARS],
        retryable=exc.retryable,
        backend_unavailable=exc.unavailable and not died,
        backend_died=died,
        request_refused=exc.refused and not died,
    )


async def backend_died(backend: BackendBase, exc: BackendError) -> bool:
    """Whether a job's backend died while it ran: the connection broke mid-request and the backend's
    health check now fails. A backend that was killed refuses connections at once; one that merely cut a
    stream (or a proxy that did) still answers. A health check that does not answer in time counts as
    dead too: the backend lost the request and cannot say why."""
    if not exc.connection_lost:
        return False
    try:
        async with asyncio.timeout(DEATH_CHECK_TIMEOUT):
            return not await backend.healthy()
    except Exception:  # a timeout, or a backend whose health check itself fails
        return True
