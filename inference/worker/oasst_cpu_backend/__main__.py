"""``oasst-cpu-backend`` / ``python -m oasst_cpu_backend``: serve the model over HTTP with uvicorn."""

from __future__ import annotations

import logging
import sys
from types import FrameType

import uvicorn
from fastapi import FastAPI
from loguru import logger

from oasst_cpu_backend.app import begin_shutdown, create_app
from oasst_cpu_backend.settings import ModelNotFoundError, Settings
from oasst_shared.model_registry import ModelRegistryError


class _InterceptHandler(logging.Handler):
    """Routes uvicorn's standard-library logging through loguru, so there is one log format."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level: str | int = logger.level(record.levelname).name
        except ValueError:
            level = record.levelno
        logger.opt(depth=6, exception=record.exc_info).log(level, record.getMessage())


def configure_logging(level: str) -> None:
    logger.remove()
    logger.add(sys.stderr, level=level.upper())
    logging.basicConfig(handlers=[_InterceptHandler()], level=0, force=True)
    # uvicorn's loggers stop at the level loguru shows: when they let TRACE through, uvicorn wraps the app in
    # a middleware that logs every ASGI message (every streamed token), all of it then filtered out.
    threshold = logging.getLevelName(level.upper())  # an int for the standard level names
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        std_logger = logging.getLogger(name)
        std_logger.handlers = [_InterceptHandler()]
        std_logger.propagate = False
        std_logger.setLevel(threshold if isinstance(threshold, int) else logging.NOTSET)


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self._app = app

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # No logging here: a signal handler that takes the log lock can deadlock the main thread.
        begin_shutdown(self._app)
        super().handle_exit(sig, frame)


def main() -> None:
    settings = Settings()
    configure_logging(settings.log_level)
    if settings.model_config_name is None:
        try:
            model_path = settings.resolved_model_path()
        except ModelNotFoundError as error:
            logger.error("cannot start: {}", error)
            raise SystemExit(2) from error
        # Resolved once here so that the lifespan does not look for the package again.
        settings = settings.model_copy(update={"model_path": model_path})
        serving = model_path.name
    else:
        serving = f"model config {settings.model_config_name}"
    logger.info("starting the CPU backend on http://{}:{} with {}", settings.host, settings.port, serving)
    try:
        app = create_app(settings)
    except ModelRegistryError as error:
        logger.error("cannot start: {}", error)
        raise SystemExit(2) from error
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=settings.access_log,
        timeout_graceful_shutdown=int(settings.graceful_shutdown_seconds),
    )
    _Server(config, app).run()


if __name__ == "__main__":
    main()
