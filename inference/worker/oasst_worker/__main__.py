"""``oasst-worker``: serve one backend to the inference server."""

from __future__ import annotations

import asyncio
import signal
import sys

from loguru import logger
from prometheus_client import start_http_server

from oasst_worker.backends.factory import create_backend
from oasst_worker.connection.client import FatalWorkerError, WorkerClient
from oasst_worker.settings import WorkerSettings


async def _main(settings: WorkerSettings) -> int:
    model_config = settings.resolve_model_config()
    backend = create_backend(settings, model_config)
    client = WorkerClient(settings, backend, model_config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(client.drain()))
    try:
        await client.run()
    except FatalWorkerError as exc:
        logger.error("{}", exc)
        return 2
    finally:
        await backend.close()
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
