"""``oasst-worker``: serve one backend to the inference server."""

from __future__ import annotations

import asyncio
import signal
import sys

from loguru import logger
from prometheus_client import start_http_server

from oasst_shared.model_configs import ModelConfig
from oasst_worker.backends.factory import create_embedding_backend, create_generation_backend
from oasst_worker.connection.client import WorkerClient
from oasst_worker.connection.errors import FatalWorkerError
from oasst_worker.jobs.base import JobFactory
from oasst_worker.jobs.embedding import EmbeddingJobFactory
from oasst_worker.jobs.generation import GenerationJobFactory
from oasst_worker.settings import WorkerSettings


def job_factory(settings: WorkerSettings, model_config: ModelConfig) -> JobFactory:
    """The jobs of the worker's kind, on the backend the settings choose."""
    if settings.backend_kind == "embedding":
        return EmbeddingJobFactory(create_embedding_backend(settings), model_config)
    return GenerationJobFactory(create_generation_backend(settings, model_config), model_config)


async def _main(settings: WorkerSettings) -> int:
    jobs = job_factory(settings, settings.resolve_model_config())
    client = WorkerClient(settings, jobs)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(client.drain()))
    try:
        await client.run()
    except FatalWorkerError as exc:
        logger.error("{}", exc)
        return 2
    finally:
        await jobs.backend.close()
    logger.info("worker stopped")
    return 0


def main() -> None:
    settings = WorkerSettings()
    logger.remove()
    logger.add(sys.stderr, level=settings.log_level.upper(), backtrace=False, diagnose=False)
    if settings.metrics_port:
        start_http_server(
            settings.metrics_port,
            addr=settings.metrics_host,
        )
        logger.info("metrics on :{}/metrics", settings.metrics_port)
    sys.exit(asyncio.run(_main(settings)))


if __name__ == "__main__":
    main()
