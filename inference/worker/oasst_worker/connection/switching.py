"""Switching the model a connection serves when the server asks (protocol 6: ``load_model``,
``unload_model``).

A :class:`Switching` belongs to one connection (one backend). It answers a frame it cannot act on at
once with a ``model_switch`` of step ``failed`` (a *refusal*: the name is not one of its ``servable``, or
a switch is under way; the worker serves on as before), followed by a ``worker_info`` of what it serves
unless the refusal is of a second switch while one runs (that one's own ``worker_info`` follows it). Otherwise it runs the switch:

1. ``draining``: the connection takes no new work (free slots 0) and waits until every job in flight has
   ended as it would have anyway (a cancel still works meanwhile);
2. the backend half (:class:`BackendSwitcher`): ``unloading``, ``quantizing`` with the quantizer's
   tensors, ``loading``, ``starting``, each when the backend reports it (steps never go back);
3. the jobs of the model served now are made and probed as at the handshake (template, lengths, stop
   sequences, the backend's model id and revision);
4. ``ready`` or ``failed`` (with the error), then a fresh ``worker_info`` saying what is served now: the new
   model, the previous one after a failed load, or after an unload the last one with ``loaded`` false.

A ``load_model`` of the model served already is answered with ``ready`` and the ``worker_info`` at once.

The backend half lives in :mod:`oasst_worker.managed.model_manager`; this module knows it only as the
:class:`BackendSwitcher` protocol, and its connection as :class:`SwitchLink`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from loguru import logger
from pydantic import BaseModel
from websockets.exceptions import ConnectionClosed

from oasst_shared.model_configs import ModelConfig
from oasst_shared.protocol import (
    MAX_ERROR_CHARS,
    LoadModel,
    ModelSwitch,
    ServableModel,
    SwitchStep,
    UnloadModel,
)
from oasst_worker.jobs.base import JobFactory
from oasst_worker.settings import WorkerSettings

# The order of a switch's steps: a step reported after a later one is not sent (a backend's progress is
# polled, and a poll may see the state of an earlier step).
STEP_ORDER: tuple[SwitchStep, ...] = ("draining", "unloading", "quantizing", "loading", "starting")
SWITCH_IN_PROGRESS = "a switch is in progress"
# A backend that has just loaded a model is asked to describe it this many times, this far apart.
PROBE_ATTEMPTS = 3
PROBE_RETRY_DELAY = 1.0


@dataclass(frozen=True)
class SwitchProgress:
    model: str
    step: str  # unloading, quantizing, loading, starting, ready
    tensors_done: int | None = None
    tensors_total: int | None = None


OnProgress = Callable[[SwitchProgress], None]
# The jobs of a connection, given its settings (its backend_url, its parallel requests) and a model config.
JobMaker = Callable[[WorkerSettings, ModelConfig], JobFactory]


class Sender(Protocol):
    """The frame writer of the connection that asked for a switch (a FrameSender)."""

    @property
    def closed(self) -> bool: ...

    async def send(self, frame: BaseModel) -> None: ...


class SwitchError(RuntimeError):
    """The switch failed; ``serving`` is the config the backends serve now (None: nothing)."""

    def __init__(self, message: str, serving: str | None) -> None:
        super().__init__(message)
        self.serving = serving


class BackendSwitcher(Protocol):
    """The backend half of a switch (:class:`oasst_worker.managed.model_manager.ModelManager`)."""

    @property
    def current(self) -> ModelConfig:
        """The config the backend serves, or last served when it holds none."""
        ...

    @property
    def loaded(self) -> bool: ...

    async def probe(self) -> None:
        """Learn what the backend says about itself (once per connection, before the worker describes
        itself): whether it can be switched, the size of the model it holds."""
        ...

    def servable_models(self) -> list[ServableModel]:
        """What the backend can be switched to, ``current`` among them; empty: it cannot be switched."""
        ...

    async def switch(self, name: str, on_progress: OnProgress) -> ModelConfig:
        """Serve ``name``; raises :class:`SwitchError` (``serving`` says what is served after it)."""
        ...

    async def unload(self, on_progress: OnProgress) -> None:
        """Free the backend's model; raises :class:`SwitchError`."""
        ...


class SwitchLink(Protocol):
    """What a switch needs of its connection (the :class:`~oasst_worker.connection.client.WorkerClient`)."""

    @property
    def settings(self) -> WorkerSettings: ...

    async def finish_jobs(self) -> None:
        """Until every job in flight has ended."""
        ...

    async def serve_with(self, jobs: JobFactory, settings: WorkerSettings) -> None:
        """Serve with ``jobs`` (already prepared) and ``settings`` from now on."""
        ...

    async def announce(self) -> None:
        """Send a fresh ``worker_info``."""
        ...


class Switching:
    """The switches of one connection: what it may load, whether one runs, and running one."""

    def __init__(self, backend: BackendSwitcher, make_jobs: JobMaker, operator: WorkerSettings) -> None:
        self._backend = backend
        self._make_jobs = make_jobs
        self._operator = operator  # the settings as given: parallel requests follow each config from them
        self.busy = False

    @property
    def backend(self) -> BackendSwitcher:
        return self._backend

    @property
    def loaded(self) -> bool:
        return self._backend.loaded

    async def probe(self) -> None:
        await self._backend.probe()

    def servable(self) -> list[ServableModel]:
        return self._backend.servable_models()

    def refusal(self, frame: LoadModel | UnloadModel) -> str | None:
        """Why ``frame`` is answered with ``failed`` at once (nothing changes), or None to run it."""
        if self.busy:
            return SWITCH_IN_PROGRESS
        names = [s.config.name for s in self.servable()]
        if not names:
            return "this worker cannot switch models: its backend is not one it can switch"
        if isinstance(frame, LoadModel) and frame.model_config_name not in names:
            listed = ", ".join(names)
            return f"this worker cannot serve {frame.model_config_name!r}; it can serve: {listed}"[
                :MAX_ERROR_CHARS
            ]
        return None

    def model_name(self, frame: LoadModel | UnloadModel) -> str:
        """The config a frame's ``model_switch`` frames name: the one loaded, or the one unloaded."""
        return frame.model_config_name if isinstance(frame, LoadModel) else self._backend.current.name

    def start(self, frame: LoadModel | UnloadModel, sender: Sender, link: SwitchLink) -> asyncio.Task[None]:
        """Run the switch in a task (frames go on being read: pings, cancels); busy from now on."""
        self.busy = True
        return asyncio.create_task(self.run(frame, sender, link), name=f"switch-{frame.request_id}")

    async def run(self, frame: LoadModel | UnloadModel, sender: Sender, link: SwitchLink) -> None:
        """Drain, switch, re-probe, report (see the module's docstring). ``sender`` writes to the
        connection that asked; once it is gone the frames are dropped, and a switch whose backend half has
        not begun is given up (nothing changed)."""
        self.busy = True
        try:
            await self._run(frame, Steps(frame.request_id, self.model_name(frame), sender), link)
        finally:
            self.busy = False

    async def _run(self, frame: LoadModel | UnloadModel, steps: Steps, link: SwitchLink) -> None:
        backend = self._backend
        logger.info("switch {}: {} {}", frame.request_id, frame.type, steps.model)
        if (
            isinstance(frame, LoadModel)
            and backend.loaded
            and frame.model_config_name == backend.current.name
        ):
            await steps.send("ready")  # served already: nothing to drain, unload or load
            self.busy = False
            with contextlib.suppress(ConnectionClosed):
                await link.announce()
            return
        await steps.send("draining")
        await link.finish_jobs()
        if not steps.connected:
            logger.warning("switch {}: the connection that asked is gone: not switching", frame.request_id)
            return
        error: str | None = None
        try:
            if isinstance(frame, LoadModel):
                await backend.switch(frame.model_config_name, steps.progress)
            else:
                await backend.unload(steps.progress)
        except SwitchError as exc:
            error = str(exc)
        except Exception as exc:  # an answer the manager did not expect: said, and the worker goes on
            logger.opt(exception=exc).error("switch {} failed", frame.request_id)
            error = f"{type(exc).__name__}: {exc}"
        await steps.settled()
        if backend.loaded:
            try:
                await self._serve(backend.current, link)
            except Exception as exc:
                error = (
                    error or f"{backend.current.name} is loaded but its backend does not describe it: {exc}"
                )
                await self._give_up(backend.current.name, error)
        serving = backend.current.name if backend.loaded else "nothing"
        if error is None:
            logger.info("switch {}: ready, serving {}", frame.request_id, serving)
            await steps.send("ready")
        else:
            logger.error("switch {} failed ({}): serving {}", frame.request_id, error, serving)
            await steps.send("failed", error[:MAX_ERROR_CHARS])
        self.busy = False  # before the worker_info: the server may send work as soon as it reads it
        if steps.connected:
            with contextlib.suppress(ConnectionClosed):
                await link.announce()

    async def _serve(self, config: ModelConfig, link: SwitchLink) -> None:
        """Make the jobs of ``config`` and probe the backend as the handshake does (a few tries: the
        backend has only just become healthy)."""
        parallel = self._operator.parallel_requests(config)
        settings = link.settings.model_copy(update={"max_parallel_requests": parallel})
        jobs = self._make_jobs(settings, config)
        try:
            for attempt in range(1, PROBE_ATTEMPTS + 1):
                try:
                    await jobs.prepare()
                    break
                except Exception as exc:
                    if attempt == PROBE_ATTEMPTS:
                        raise
                    logger.warning(
                        "probing the backend serving {} failed ({}): trying again", config.name, exc
                    )
                    await asyncio.sleep(PROBE_RETRY_DELAY)
        except BaseException:  # failed, or the switch was cancelled (the worker stops): never served
            await jobs.backend.close()
            raise
        await link.serve_with(jobs, settings)

    async def _give_up(self, name: str, error: str) -> None:
        """The backend holds a model the worker cannot describe: unloaded, so that what the worker says
        (``loaded`` false) is true."""
        logger.error("{}: unloading it", error)
        try:
            await self._backend.unload(lambda _: None)
        except Exception as exc:
            logger.error("unloading {} failed too: {}", name, exc)


class Steps:
    """The ``model_switch`` frames of one switch, in order, each step once (``quantizing`` again as its
    tensors advance), from a progress callback that cannot wait."""

    def __init__(self, request_id: str, model: str, sender: Sender) -> None:
        self.request_id = request_id
        self.model = model
        self._sender = sender
        self._last: tuple[int, int | None] = (-1, None)
        self._pending: asyncio.Task[None] | None = None

    def progress(self, progress: SwitchProgress) -> None:
        if progress.step not in STEP_ORDER:
            return  # ready and failed are said by the switch itself, once it has probed the backend
        frame = self._frame(progress.step, progress.tensors_done, progress.tensors_total)
        if frame is not None:
            previous = self._pending
            self._pending = asyncio.create_task(self._after(previous, frame))

    async def send(self, step: SwitchStep, error: str | None = None) -> None:
        await self.settled()
        frame = self._frame(step, None, None, error)
        if frame is not None:
            await self._write(frame)

    @property
    def connected(self) -> bool:
        return not self._sender.closed

    async def settled(self) -> None:
        """Until every progress frame reported so far is written (or dropped)."""
        if self._pending is not None:
            await self._pending

    def _frame(
        self, step: SwitchStep, done: int | None, total: int | None, error: str | None = None
    ) -> ModelSwitch | None:
        rank = STEP_ORDER.index(step) if step in STEP_ORDER else len(STEP_ORDER)
        last_rank, last_done = self._last
        if rank < last_rank or (rank == last_rank and (step != "quantizing" or done == last_done)):
            return None
        self._last = (rank, done)
        return ModelSwitch(
            request_id=self.request_id,
            model_config_name=self.model,
            step=step,
            tensors_done=done,
            tensors_total=total,
            error=error,
        )

    async def _after(self, previous: asyncio.Task[None] | None, frame: ModelSwitch) -> None:
        if previous is not None:
            await previous
        await self._write(frame)

    async def _write(self, frame: ModelSwitch) -> None:
        with contextlib.suppress(ConnectionClosed):  # the frames of a lost connection are dropped
            await self._sender.send(frame)
