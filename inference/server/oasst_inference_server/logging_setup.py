"""Route the standard library's logging (uvicorn, sqlalchemy) through loguru, once per process."""

from __future__ import annotations

import logging
import os
import sys

from loguru import logger


class _InterceptHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.INFO and _from_websockets(record):
            # At DEBUG the websockets library logs every handshake header (a worker's X-API-Key) and
            # every frame (users' text), under whichever logger uvicorn hands it: never kept.
            return
        try:
            level: str | int = logger.level(record.levelname).name
        except ValueError:
            level = record.levelno
        logger.opt(depth=6, exception=record.exc_info).log(level, record.getMessage())


def _from_websockets(record: logging.LogRecord) -> bool:
    return f"{os.sep}websockets{os.sep}" in record.pathname


def configure_logging(level: str = "INFO") -> None:
    logger.remove()
    logger.add(sys.stderr, level=level.upper(), enqueue=False, backtrace=False, diagnose=False)
    # The standard loggers get the same level as loguru: below INFO, uvicorn wraps the app in its
    # TRACE message logger, which formats every ASGI message (a fifth of the relay's CPU).
    std_level = logging.getLevelName(level.upper())
    if not isinstance(std_level, int):
        std_level = logging.INFO
    logging.basicConfig(handlers=[_InterceptHandler()], level=std_level, force=True)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers = [_InterceptHandler()]
        logging.getLogger(name).propagate = False
        logging.getLogger(name).setLevel(std_level)
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
