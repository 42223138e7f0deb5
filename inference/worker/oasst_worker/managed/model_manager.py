"""Which model configs a worker can serve, and switching the model its backends serve.

The fleet side (the server's load and unload over the worker protocol, issue 25 items 4-6) calls
:meth:`ModelManager.switch` after the worker has drained; this module does the backend half:

* the bundled CPU backend, started by the worker or by the operator: ``POST /admin/load`` with the
  config's name, its ``/health`` polled for the step and the quantizer's progress meanwhile; a failed
  load leaves the backend serving the previous model (it falls back itself);
* a TGI or vLLM backend the worker started: the process is stopped and started again with the new
  config's arguments; if it does not become healthy, the previous config's process is started again;
* a TGI or vLLM server the operator runs cannot be switched from here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from loguru import logger

from oasst_shared.model_configs import ModelConfig
from oasst_shared.model_registry import ModelRegistry
from oasst_worker.managed.launch import launch_for
from oasst_worker.managed.supervisor import ManagedBackend
from oasst_worker.settings import WorkerSettings


@dataclass(frozen=True)
class SwitchProgress:
    model: str
    step: str  # unloading, quantizing, loading, starting, ready
    tensors_done: int | None = None
    tensors_total: int | None = None


class SwitchError(RuntimeError):
    """The switch failed; ``serving`` is the config the backends serve now (None: nothing)."""

    def __init__(self, message: str, serving: str | None) -> None:
        super().__init__(message)
        self.serving = serving


OnProgress = Callable[[SwitchProgress], None]


@dataclass
class BackendTarget:
    """One backend the manager switches: its URL, and its process where the worker started it."""

    url: str
    managed: ManagedBackend | None = None


class ModelManager:
    def __init__(
        self,
        settings: WorkerSettings,
        registry: ModelRegistry,
        current: ModelConfig,
        backends: list[BackendTarget],
        *,
        ready_timeout: float = 600.0,
        poll_interval: float = 0.5,
    ) -> None:
        self._settings = settings
        self._registry = registry
        self.current = current
        self._backends = backends
        self._ready_timeout = ready_timeout
        self._poll = poll_interval
        self._lock = asyncio.Lock()

    def servable(self) -> list[ModelConfig]:
        """The registry's configs whose backend this worker runs (and of the kind its adapter serves)."""
        kind = "embedding" if self._settings.backend_kind == "embedding" else "generation"
        runs = self._settings.runs_backends
        return sorted(
            (c for c in self._registry.values() if c.backend in runs and c.kind == kind), key=lambda c: c.name
        )

    async def switch(self, name: str, on_progress: OnProgress | None = None) -> ModelConfig:
        """Serve ``name`` on every backend of this worker; raises :class:`SwitchError` (its ``serving``
        says what is served after the failure) or ``KeyError`` for a config it cannot serve."""
        config = self._registry.require(name)
        if config not in self.servable():
            raise KeyError(
                f"this worker cannot serve {name!r}: it runs {', '.join(self._settings.runs_backends)}"
            )
        report = on_progress or (lambda _: None)
        async with self._lock:
            if config.backend == "cpu":
                await asyncio.gather(*(self._load_cpu(b.url, config, report) for b in self._backends))
            elif all(b.managed is not None for b in self._backends):
                await asyncio.gather(*(self._relaunch(b, config, report) for b in self._backends))
            else:
                raise SwitchError(
                    f"the {config.backend} server at {self._backends[0].url} is the operator's: it cannot be "
                    "switched by the worker",
                    self.current.name,
                )
            self.current = config
            report(SwitchProgress(name, "ready"))
            logger.info("serving {} now", name)
            return config

    async def _load_cpu(self, url: str, config: ModelConfig, report: OnProgress) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(10.0, read=None)) as http:
            loading = asyncio.create_task(http.post("/admin/load", json={"model_config_name": config.name}))
            while not loading.done():
                await asyncio.wait({loading}, timeout=self._poll)
                if not loading.done():
                    await self._report_health(http, config.name, report)
            response = loading.result()
        if response.status_code == 200:
            return
        try:
            body = response.json()
        except ValueError:
            body = {"error": response.text[:500]}
        serving = body.get("fallback") if body.get("error_type") == "load_failed" else self.current.name
        raise SwitchError(f"{url}: {body.get('error', response.status_code)}", serving)

    async def _report_health(self, http: httpx.AsyncClient, name: str, report: OnProgress) -> None:
        try:
            body = (await http.get("/health", timeout=2.0)).json()
        except (httpx.HTTPError, ValueError):
            return
        progress = body.get("progress") or {}
        step = progress.get("step") or ("unloading" if body.get("status") == "unloaded" else "loading")
        report(SwitchProgress(name, step, progress.get("tensors_done"), progress.get("tensors_total")))

    async def _relaunch(self, backend: BackendTarget, config: ModelConfig, report: OnProgress) -> None:
        managed = backend.managed
        assert managed is not None
        previous = managed.launch
        port = int(backend.url.rsplit(":", 1)[1])
        gpus = [g for g in previous.env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
        report(SwitchProgress(config.name, "starting"))
        await managed.replace(launch_for(self._settings, config, port=port, gpus=gpus))
        if await self._healthy(backend.url):
            return
        logger.error(
            "{} did not become healthy with {}: starting {} again",
            managed.name,
            config.name,
            self.current.name,
        )
        await managed.replace(previous)
        serving = self.current.name if await self._healthy(backend.url) else None
        raise SwitchError(f"{managed.name} did not become healthy serving {config.name}", serving)

    async def _healthy(self, url: str) -> bool:
        deadline = time.monotonic() + self._ready_timeout
        async with httpx.AsyncClient(base_url=url, timeout=2.0) as http:
            while time.monotonic() < deadline:
                try:
                    if (await http.get("/health")).status_code == 200:
                        return True
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(self._poll)
        return False
