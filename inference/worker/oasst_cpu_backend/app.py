"""The app: ``create_app()`` (the lifespan loads the model and builds the serving state) and the shutdown
hook for the server's signal handler."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from loguru import logger

from oasst_cpu_backend.engine import ModelEngine
from oasst_cpu_backend.errors import install_error_handlers
from oasst_cpu_backend.metrics import BackendMetrics
from oasst_cpu_backend.routes import install_routes
from oasst_cpu_backend.scheduler import Scheduler
from oasst_cpu_backend.settings import Settings
from oasst_cpu_backend.state import ServingState, build_info, load_engine, package_version
from oasst_cpu_backend.validation import Limits


def create_app(settings: Settings | None = None, engine: ModelEngine | None = None) -> FastAPI:
    """Build the app; the model is loaded in the lifespan unless an engine is given."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = engine is None
        model: ModelEngine = engine if engine is not None else await asyncio.to_thread(load_engine, settings)
        limits = Limits(
            n_ctx=model.n_ctx,
            max_input_length=min(settings.effective_max_input_length, model.n_ctx - 1),
            max_stop_sequences=settings.max_stop_sequences,
            max_top_n_tokens=settings.max_top_n_tokens,
        )
        metrics = BackendMetrics()
        metrics.kv_cache_free_tokens.set(model.n_ctx)
        scheduler = Scheduler(model, metrics, settings.max_concurrent_requests)
        app.state.loop = asyncio.get_running_loop()
        app.state.serving = ServingState(
            settings, model, scheduler, metrics, limits, build_info(settings, model, limits)
        )
        logger.info("ready to serve {} (context {} tokens)", settings.model_id, model.n_ctx)
        try:
            yield
        finally:
            logger.info("shutting down: stopping generations")
            await asyncio.to_thread(scheduler.shutdown)
            if owned:
                model.close()
            logger.info("shut down")

    app = FastAPI(title="oasst CPU backend (TGI-compatible)", version=package_version(), lifespan=lifespan)
    install_error_handlers(app)
    install_routes(app)
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
