"""The model the backend serves, and changing it while it runs: unload before load, fall back on failure.

One :class:`ModelHost` per app. A load first unloads the model being served (its in-flight requests end
with a 503-style error their clients retry elsewhere; a worker drains before it asks), then makes and loads
the new one; if that fails, the previous model is loaded again (its file is cached, so that is quick) and
the load answers with the error. ``/health`` answers 200 only while a model is served; otherwise 503 with
what is happening (``loading`` with its step and progress, ``unloaded``, or ``failed`` with the error).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import FastAPI
from loguru import logger

from oasst_cpu_backend.engine import ModelEngine
from oasst_cpu_backend.loading import LoadedModel, LoadError, LoadPlan, LoadProgress, load, plan_load
from oasst_cpu_backend.model_files import read_gguf
from oasst_cpu_backend.settings import Settings
from oasst_cpu_backend.state import ServingState, build_serving
from oasst_shared.model_registry import ModelRegistry

HostState = Literal["loading", "ready", "unloaded", "failed"]


class LoadFailed(RuntimeError):
    """A load failed; ``fallback`` is the model served again instead (None: nothing is served)."""

    def __init__(self, message: str, fallback: str | None) -> None:
        super().__init__(message)
        self.fallback = fallback


class UnknownModelConfig(LookupError):
    pass


class LoadInProgress(RuntimeError):
    pass


@dataclass
class HostStatus:
    state: HostState
    model: str | None = None
    progress: LoadProgress | None = None
    error: str | None = None
    since: float = 0.0

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"status": "ok" if self.state == "ready" else self.state, "model": self.model}
        if self.progress is not None and self.state == "loading":
            step: dict[str, Any] = {"step": self.progress.step}
            quantize = self.progress.quantize
            if quantize is not None and self.progress.step == "quantizing":
                step["tensors_done"] = quantize.tensors_done
                step["tensors_total"] = quantize.tensors_total
            body["progress"] = step
        if self.error:
            body["error"] = self.error
        return body


class ModelHost:
    def __init__(self, app: FastAPI, settings: Settings, registry: ModelRegistry) -> None:
        self._app = app
        self.settings = settings
        self.registry = registry
        self.status = HostStatus("unloaded")
        self._lock = asyncio.Lock()
        self._current: LoadPlan | None = None
        self._owned = True  # False for an engine given at start: its caller closes it

    @property
    def serving(self) -> ServingState | None:
        state: ServingState | None = getattr(self._app.state, "serving", None)
        return state

    async def start(self, engine: ModelEngine | None = None) -> None:
        """The model of the settings (``model_config_name``, else ``model_path``), or a given engine."""
        async with self._lock:
            if engine is not None:
                self._owned = False
                plan = LoadPlan(
                    None, self.settings.model_id, read_gguf(engine.model_path), None, engine.n_ctx
                )
                await self._serve(LoadedModel(plan, engine, engine.model_path, plan.source.file_type, 0.0))
                return
            name = self.settings.model_config_name
            config = self.registry.require(name) if name is not None else None
            plan = await asyncio.to_thread(plan_load, self.settings, config)
            await self._load(plan)

    async def load(self, name: str) -> LoadedModel:
        """Serve the model config ``name`` instead of the current model."""
        if name not in self.registry:
            raise UnknownModelConfig(f"unknown model config {name!r}; known: {sorted(self.registry)}")
        if self._lock.locked():
            raise LoadInProgress(f"a load of {self.status.model} is under way")
        async with self._lock:
            config = self.registry[name]
            plan = await asyncio.to_thread(plan_load, self.settings, config)  # LoadError before unloading
            previous = self._current
            await self._unload()
            try:
                return await self._load(plan)
            except Exception as exc:
                message = f"loading {name} failed: {exc}"
                logger.error("{}", message)
                fallback = await self._fall_back(previous)
                self.status.error = message
                raise LoadFailed(message, fallback) from exc

    async def unload(self) -> None:
        if self._lock.locked():
            raise LoadInProgress(f"a load of {self.status.model} is under way")
        async with self._lock:
            await self._unload()

    async def close(self) -> None:
        """At shutdown: stop every generation and free the model."""
        await self._unload(closing=True)

    # ------------------------------------------------------------------ inside the lock
    async def _load(self, plan: LoadPlan) -> LoadedModel:
        progress = LoadProgress(plan.name)
        self.status = HostStatus("loading", plan.name, progress, since=time.monotonic())
        logger.info("loading model {}", plan.name)
        try:
            loaded = await asyncio.to_thread(load, plan, self.settings, progress)
        except Exception as exc:
            self.status = HostStatus("failed", plan.name, error=str(exc), since=time.monotonic())
            raise
        await self._serve(loaded)
        return loaded

    async def _serve(self, loaded: LoadedModel) -> None:
        serving = await asyncio.to_thread(build_serving, self.settings, loaded)
        self._app.state.serving = serving
        self._current = loaded.plan
        self.status = HostStatus("ready", loaded.plan.name, since=time.monotonic())
        logger.info("ready to serve {} (context {} tokens)", loaded.plan.name, loaded.engine.n_ctx)

    async def _unload(self, *, closing: bool = False) -> None:
        serving = self.serving
        if serving is None:
            return
        name = serving.model.plan.name
        self._app.state.serving = None  # new requests get 503 from here on
        self._current = None if not closing else self._current
        if not closing:
            self.status = HostStatus("unloaded", since=time.monotonic())
            logger.info("unloading model {}: ending {} requests in flight", name, serving.scheduler.admitted)
        await asyncio.to_thread(serving.scheduler.shutdown)
        if self._owned:
            serving.engine.close()
        self._owned = True
        logger.info("model {} unloaded", name)

    async def _fall_back(self, previous: LoadPlan | None) -> str | None:
        if previous is None:
            return None
        logger.warning("serving the previous model {} again", previous.name)
        try:
            await self._load(previous)
        except Exception as exc:
            logger.error("the previous model {} failed to load too: {}", previous.name, exc)
            return None
        return previous.name


__all__ = ["HostStatus", "LoadError", "LoadFailed", "LoadInProgress", "ModelHost", "UnknownModelConfig"]
