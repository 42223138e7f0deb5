"""Run the server with uvicorn: one process, or ``settings.processes`` sharing the port."""

from __future__ import annotations

from typing import Any

import uvicorn
from fastapi import FastAPI

from oasst_inference_server.logging_setup import configure_logging
from oasst_inference_server.main import create_app
from oasst_inference_server.settings import Settings, get_settings
from oasst_shared.protocol import MAX_FRAME_BYTES

_UVICORN_OPTIONS: dict[str, Any] = {
    "log_config": None,
    "timeout_graceful_shutdown": 10,
    "ws_ping_interval": None,  # the protocol has its own pings with capacity reports
    # Worker frames are a few dozen bytes: deflate would cost CPU per token on both ends and save
    # next to nothing.
    "ws_per_message_deflate": False,
    # The one frame limit of the worker socket, shared with the worker (oasst_shared.protocol).
    "ws_max_size": MAX_FRAME_BYTES,
}


def app_factory() -> FastAPI:
    """The app of one of several processes: each reads the settings and sets up its own logging."""
    settings = get_settings()
    configure_logging(settings.log_level)
    return create_app(settings)


def run(settings: Settings | None = None) -> None:
    settings = settings or get_settings()
    configure_logging(settings.log_level)
    if settings.processes == 1:
        uvicorn.run(create_app(settings), host=settings.host, port=settings.port, **_UVICORN_OPTIONS)
        return
    # Separate processes import the app by name; uvicorn's supervisor restarts one that dies.
    uvicorn.run(
        f"{__name__}:app_factory",
        factory=True,
        workers=settings.processes,
        host=settings.host,
        port=settings.port,
        **_UVICORN_OPTIONS,
    )
