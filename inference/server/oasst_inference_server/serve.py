"""Run the server with uvicorn: one process, or ``settings.processes`` sharing the port.

Both ways run the same protocol class with the same limits on connections and request heads
(:mod:`.api.connection_guard`): every way of starting the server (``oasst-server``, ``make up``, the
images, the Kubernetes manifests, ``full-dev-setup.sh``) comes through :func:`run`.
"""

from __future__ import annotations

import sys
from typing import Any

import uvicorn
from fastapi import FastAPI
from loguru import logger
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess

from oasst_inference_server.api.connection_guard import ConnectionLimits, GuardedConfig, usable_connections
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


def connection_limits(settings: Settings) -> ConnectionLimits:
    limits = ConnectionLimits(
        header_timeout=settings.request_header_timeout,
        max_header_bytes=settings.max_request_header_bytes,
        max_connections=usable_connections(settings.max_connections),
    )
    if limits.max_connections < settings.max_connections:
        logger.warning(
            "at most {} connections per process (OASST_SERVER_MAX_CONNECTIONS is {}, but the open-file "
            "limit allows no more)",
            limits.max_connections,
            settings.max_connections,
        )
    logger.info(
        "connections: at most {} open per process; a request head within {:g} s and {} bytes",
        limits.max_connections,
        limits.header_timeout,
        limits.max_header_bytes,
    )
    return limits


def run(settings: Settings | None = None) -> None:
    settings = settings or get_settings()
    configure_logging(settings.log_level)
    limits = connection_limits(settings)
    several = settings.processes > 1
    config = GuardedConfig(
        # Separate processes import the app by name; uvicorn's supervisor restarts one that dies.
        f"{__name__}:app_factory" if several else create_app(settings),
        limits=limits,
        factory=several,
        workers=settings.processes,
        host=settings.host,
        port=settings.port,
        **_UVICORN_OPTIONS,
    )
    # What uvicorn.run does with a configuration (0.54 and later), for a configuration of our own.
    server = uvicorn.Server(config)
    try:
        if several:
            Multiprocess(config, sockets=[config.bind_socket()]).run()
        else:
            server.run()
    except KeyboardInterrupt:
        pass
    if not several and not server.started:
        sys.exit(STARTUP_FAILURE)
