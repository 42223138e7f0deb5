"""Which model configs a worker's backend can be switched to, and switching it (the backend half of a
protocol 6 switch; :mod:`oasst_worker.connection.switching` is the protocol half).

* the bundled CPU backend, started by the worker or by the operator (then recognised by its ``/info``):
  ``POST /admin/load`` with the config's name, its ``/health`` polled for the step and the quantizer's
  progress meanwhile; a failed load leaves the backend serving the previous model (it falls back itself).
  ``POST /admin/unload`` frees it;
* a TGI or vLLM backend the worker started: the process is stopped and started again with the new
  config's arguments, on the same GPUs; if it does not become healthy, the previous config's process is
  started again. An unload stops the process until the next load;
* a TGI, vLLM or OpenAI-compatible server the operator runs cannot be switched from here: nothing is
  servable.

One manager per connection (per backend): with several GPU groups each connection switches its own.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx
from loguru import logger

from oasst_shared.model_configs import ModelConfig
from oasst_shared.model_registry import ModelRegistry
from oasst_shared.protocol import ServableModel
from oasst_worker.connection.switching import (
    JobMaker,
    OnProgress,
    SwitchError,
    Switching,
    SwitchProgress,
)
from oasst_worker.managed.launch import LaunchError, launch_for
from oasst_worker.managed.supervisor import ManagedBackend
from oasst_worker.settings import WorkerSettings

__all__ = ["BackendTarget", "ModelManager", "SwitchError", "SwitchProgress", "model_switching"]

# What the bundled CPU backend's /info says in its `backend` field.
CPU_BACKEND_MARK = "oasst-cpu-backend"
# The CPU backend's /health steps as switch steps ("reading" the files is part of loading).
_CPU_STEPS = {"quantizing": "quantizing", "loading": "loading"}
_MAX_LOAD_SECONDS = 86_400.0


def _ignore(_: SwitchProgress) -> None:
    return None


@dataclass
class BackendTarget:
    """One backend the manager switches: its URL, and its process where the worker started it."""

    url: str
    managed: ManagedBackend | None = None

    @property
    def gpus(self) -> list[str]:
        if self.managed is None:
            return []
        return [g for g in self.managed.launch.env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


class ModelManager:
    def __init__(
        self,
        settings: WorkerSettings,
        registry: ModelRegistry,
        current: ModelConfig,
        backends: list[BackendTarget],
        *,
        ready_timeout: float = 600.0,
        poll_interval: float = 0.25,
    ) -> None:
        self._settings = settings
        self._registry = registry
        self.current = current
        self.loaded = True
        self._backends = backends
        self._ready_timeout = ready_timeout
        self.poll_interval = poll_interval  # seconds between polls of a loading backend
        self._lock = asyncio.Lock()
        # A backend the operator runs is switchable once its /info says it is the bundled CPU backend.
        self._cpu_backend = settings.managed_backend == "cpu"
        self._memory: dict[str, int] = {}  # bytes of the file the CPU backend loaded, by config
        self._load_seconds: dict[str, float] = {}  # this worker's last load of each config

    # ------------------------------------------------------------------ what can be served
    def servable(self) -> list[ModelConfig]:
        """The registry's configs this worker can switch its backends to, by name; empty when it cannot
        switch them (or cannot come back to the config it serves)."""
        kind = "embedding" if self._settings.backend_kind == "embedding" else "generation"
        configs = [c for c in self._registry.values() if c.kind == kind and self._can_run(c)]
        if self.current.name not in {c.name for c in configs}:
            return []
        return sorted(configs, key=lambda c: c.name)

    def servable_models(self) -> list[ServableModel]:
        return [
            ServableModel(
                config=config,
                memory_bytes=self._memory.get(config.name),
                load_seconds=self._load_seconds.get(config.name),
            )
            for config in self.servable()
        ]

    def _can_run(self, config: ModelConfig) -> bool:
        managed = self._settings.managed_backend
        if config.backend == "cpu":
            return self._cpu_backend
        if managed == "none" or config.backend != managed:
            return False  # an operator's TGI or vLLM server serves what it was started with
        gpus = [len(b.gpus) for b in self._backends]
        if self._settings.gpu_ids and any(config.gpus_per_replica != n for n in gpus):
            return False  # its backends' GPU groups were cut for another size
        try:
            launch_for(self._settings, config, port=1, gpus=[])
        except LaunchError:
            return False
        return True

    async def probe(self) -> None:
        """Ask each backend's ``/info`` whether it is the bundled CPU backend, and the size of its file.
        A backend without a model (unloaded) does not answer: what it said before stands."""
        for backend in self._backends:
            try:
                async with httpx.AsyncClient(base_url=backend.url, timeout=5.0) as http:
                    response = await http.get("/info")
                info = response.json() if response.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                info = None
            if not isinstance(info, dict) or not str(info.get("backend", "")).startswith(CPU_BACKEND_MARK):
                continue
            if not self._cpu_backend:
                logger.info(
                    "the backend at {} is the bundled CPU backend: its model can be switched", backend.url
                )
            self._cpu_backend = True
            size = info.get("model_file_bytes")
            name = info.get("model_config_name") or self.current.name
            if isinstance(size, int) and isinstance(name, str) and size >= 0:
                self._memory[name] = size

    # ------------------------------------------------------------------ switching
    async def switch(self, name: str, on_progress: OnProgress | None = None) -> ModelConfig:
        """Serve ``name`` on every backend of this worker; raises :class:`SwitchError` (its ``serving``
        says what is served after the failure) or ``KeyError`` for a config it cannot serve."""
        config = self._registry.require(name)
        if name not in {c.name for c in self.servable()}:
            raise KeyError(f"this worker cannot serve {name!r}: its backend cannot be switched to it")
        report = on_progress or _ignore
        async with self._lock:
            if self.loaded and name == self.current.name:
                return self.current  # served already: nothing to unload or load
            started = time.monotonic()
            try:
                if config.backend == "cpu":
                    await asyncio.gather(*(self._load_cpu(b, config, report) for b in self._backends))
                else:
                    await asyncio.gather(*(self._relaunch(b, config, report) for b in self._backends))
            except SwitchError as exc:
                self._after_failure(exc.serving)
                raise
            self._load_seconds[name] = min(time.monotonic() - started, _MAX_LOAD_SECONDS)
            self.current, self.loaded = config, True
            report(SwitchProgress(name, "ready"))
            logger.info("serving {} now", name)
            return config

    async def unload(self, on_progress: OnProgress | None = None) -> None:
        """Free every backend's model: the CPU backend through ``/admin/unload``, a started TGI or vLLM
        by stopping it until the next load."""
        report = on_progress or _ignore
        async with self._lock:
            report(SwitchProgress(self.current.name, "unloading"))
            for backend in self._backends:
                if self.current.backend == "cpu":
                    await self._unload_cpu(backend)
                elif backend.managed is not None:
                    await backend.managed.park()
            self.loaded = False
            logger.info("{} unloaded: serving nothing", self.current.name)

    def _after_failure(self, serving: str | None) -> None:
        if serving is None:
            self.loaded = False
        elif serving != self.current.name and serving in self._registry:
            self.current, self.loaded = self._registry[serving], True

    # ------------------------------------------------------------------ the CPU backend
    def _admin_headers(self) -> dict[str, str]:
        token = self._settings.backend_admin_token
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def _load_cpu(self, backend: BackendTarget, config: ModelConfig, report: OnProgress) -> None:
        timeout = httpx.Timeout(10.0, read=None)
        async with httpx.AsyncClient(base_url=backend.url, timeout=timeout) as http:
            loading = asyncio.create_task(
                http.post(
                    "/admin/load", json={"model_config_name": config.name}, headers=self._admin_headers()
                )
            )
            try:
                while not loading.done():
                    await asyncio.wait({loading}, timeout=self.poll_interval)
                    if not loading.done():
                        await self._report_health(http, config.name, report)
                response = loading.result()
            except httpx.HTTPError as exc:
                raise SwitchError(
                    f"{backend.url}: {exc}", self.current.name if self.loaded else None
                ) from None
            finally:
                loading.cancel()
        if response.status_code == 200:
            size = _json(response).get("file_bytes")
            if isinstance(size, int):
                self._memory[config.name] = size
            if backend.managed is not None:  # a crashed backend restarts with the model it serves now
                backend.managed.launch = launch_for(
                    self._settings, config, port=backend.port, gpus=backend.gpus
                )
            return
        body = _json(response)
        if body.get("error_type") == "load_failed":
            serving = body.get("fallback") if isinstance(body.get("fallback"), str) else None
        else:  # refused before unloading: the backend serves what it did
            serving = self.current.name if self.loaded else None
        raise SwitchError(f"{backend.url}: {body.get('error', response.status_code)}", serving)

    async def _report_health(self, http: httpx.AsyncClient, name: str, report: OnProgress) -> None:
        try:
            body = (await http.get("/health", timeout=2.0)).json()
        except (httpx.HTTPError, ValueError):
            return
        if not isinstance(body, dict):
            return
        if body.get("status") in ("unloaded", "loading") and self.loaded:
            # The backend unloads before it loads (a load it refuses at once unloads nothing).
            report(SwitchProgress(name, "unloading"))
        progress = body.get("progress")
        if not isinstance(progress, dict):
            progress = {}
        step = _CPU_STEPS.get(str(progress.get("step", "")))
        if step is None:
            return
        done, total = progress.get("tensors_done"), progress.get("tensors_total")
        # A total of 0: the quantizer has not counted the tensors yet.
        ints = isinstance(done, int) and isinstance(total, int) and total > 0 and step == "quantizing"
        report(SwitchProgress(name, step, done if ints else None, total if ints else None))

    async def _unload_cpu(self, backend: BackendTarget) -> None:
        try:
            async with httpx.AsyncClient(base_url=backend.url, timeout=60.0) as http:
                response = await http.post("/admin/unload", headers=self._admin_headers())
        except httpx.HTTPError as exc:
            raise SwitchError(f"{backend.url}: {exc}", self.current.name) from None
        if response.status_code != 200:
            error = _json(response).get("error", response.status_code)
            raise SwitchError(f"{backend.url}: {error}", self.current.name)

    # ------------------------------------------------------------------ a started TGI or vLLM
    async def _relaunch(self, backend: BackendTarget, config: ModelConfig, report: OnProgress) -> None:
        managed = backend.managed
        if managed is None:
            raise SwitchError(
                f"the {config.backend} server at {backend.url} is the operator's: it cannot be switched by "
                "the worker",
                self.current.name if self.loaded else None,
            )
        previous = managed.launch
        try:
            launch = launch_for(self._settings, config, port=backend.port, gpus=backend.gpus)
        except LaunchError as exc:
            raise SwitchError(
                f"{config.name}: {exc.field}: {exc}", self.current.name if self.loaded else None
            ) from None
        if self.loaded:
            report(SwitchProgress(config.name, "unloading"))
        await managed.replace(launch)
        report(SwitchProgress(config.name, "starting"))
        if await self._healthy(backend.url):
            return
        if not self.loaded:  # nothing to go back to: stopped again, as it was
            logger.error("{} did not become healthy with {}: stopping it", managed.name, config.name)
            await managed.park()
            raise SwitchError(f"{managed.name} did not become healthy serving {config.name}", None)
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
                await asyncio.sleep(self.poll_interval)
        return False


def _json(response: httpx.Response) -> dict[str, object]:
    try:
        body = response.json()
    except ValueError:
        return {"error": response.text[:500]}
    return body if isinstance(body, dict) else {"error": str(body)[:500]}


def model_switching(
    settings: WorkerSettings,
    registry: ModelRegistry,
    config: ModelConfig,
    target: BackendTarget,
    make_jobs: JobMaker,
) -> Switching | None:
    """The switching of one connection (None for an embedding worker, whose encoder is its own)."""
    if settings.backend_kind == "embedding":
        return None
    return Switching(ModelManager(settings, registry, config, [target]), make_jobs, settings)
