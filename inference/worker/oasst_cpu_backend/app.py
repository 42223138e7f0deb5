"""The app: ``create_app()`` (the lifespan loads the model through the model host) and the shutdown hook
for the server's signal handler."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from loguru import logger

from oasst_cpu_backend.admin import install_admin_routes
from oasst_cpu_backend.engine import ModelEngine
from oasst_cpu_backend.errors import install_error_handlers
from oasst_cpu_backend.model_host import ModelHost
from oasst_cpu_backend.routes import install_routes
from oasst_cpu_backend.settings import Settings
from oasst_cpu_backend.state import ServingState, package_version
from oasst_shared.model_registry import ModelRegistryError, load_registry


def create_app(settings: Settings | None = None, engine: ModelEngine | None = None) -> FastAPI:
    """Build the app; the model is loaded in the lifespan unless an engine is given (then its caller
    closes it). Raises ``ModelRegistryError`` for invalid model config files."""
    settings = settings or Settings()
    registry = load_registry(settings.model_configs_dir)
    name = settings.model_config_name
    if name is not None and name not in registry:
        raise ModelRegistryError(
            [f"model_config_name: unknown model config {name!r}; known: {sorted(registry)}"]
        )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.loop = asyncio.get_running_loop()
        host = app.state.model_host = ModelHost(app, settings, registry)
        await host.start(engine)
        try:
            yield
        finally:
            logger.info("shutting down: stopping generations")
            await host.close()
            logger.info("shut down")

    app = FastAPI(title="oasst CPU backend (TGI-compatible)", version=package_version(), lifespan=lifespan)
    install_error_handlers(app)
    install_routes(app)
    install_admin_routes(app)
    return app


def begin_shutdown(app: FastAPI) -> None:
    """End in-flight generations with an error their clients understand and refuse new ones.

    Meant for the server's signal handler (any thread): uvicorn would otherwise keep streaming until its
    graceful-shutdown timeout and then cut the connections.
    """
    serving: ServingState | None = getattr(app.state, "serving", None)
    loop: asyncio.AbstractEventLoop | None = getattr(app.state, "loop", None)
    if serving is not None and loop is not None and not loop.is_closed():
        loop.call_soon_threadsafe(serving.scheduler.stop_accepting)
