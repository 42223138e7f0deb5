"""Loading a model on demand, and unloading idle ones.

A request for a model that no worker has loaded but some connected worker can load is admitted and
queued (``scheduling.worker_registry``: the model is *loadable*), and once it is queued (the submission
committed) :meth:`OnDemandLoads.wanted` has a worker told to load it (:mod:`.load_choice` picks which; :class:`.switcher.ModelSwitcher` tells it). The
request waits in the model's queue meanwhile (its queue position says the model is loading) and the
worker, once it serves the model, takes it like any queued job.

When no worker can load the model right now (each is the last of a busy model, or switching), the request
stays queued, within the queue's usual bounds and timeouts, and the fleet pass (:meth:`OnDemandLoads.run`,
every ``fleet_interval`` on one replica at a time) tries again for every model that has queued work and
nobody serving or loading it. The same pass unloads workers idle past their model's ``keep_alive``
(:mod:`.keep_alive`).

A broker lock per model keeps two replicas (or two requests) from loading one model on two workers at
the same moment; each attempt reads the sessions afresh, so a load under way is seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterable

from loguru import logger

from oasst_inference_server import events
from oasst_inference_server.broker import Broker, BrokerError, WorkerSession
from oasst_inference_server.broker.session_view import SessionSnapshot, WorkerSessionView
from oasst_inference_server.domain_errors import DomainError
from oasst_inference_server.fleet.keep_alive import idle_past_keep_alive, keep_alive_models
from oasst_inference_server.fleet.load_choice import loaded_or_loading, models_to_load, worker_to_load
from oasst_inference_server.fleet.switcher import ModelSwitcher
from oasst_inference_server.settings import Settings

PASS_LOCK = "fleet-pass"


class OnDemandLoads:
    def __init__(
        self, broker: Broker, sessions: WorkerSessionView, switcher: ModelSwitcher, settings: Settings
    ) -> None:
        self._broker = broker
        self._sessions = sessions
        self._switcher = switcher
        self._settings = settings
        self.owner = f"fleet-{uuid.uuid4().hex[:12]}"
        # One attempt per model at a time in this process.
        self._attempts: dict[str, asyncio.Task[str | None]] = {}
        self._served_in: tuple[SessionSnapshot, set[str]] | None = None
        self.stopping = asyncio.Event()

    @property
    def enabled(self) -> bool:
        return self._settings.on_demand_loading

    def wanted(self, model: str) -> None:
        """A request for ``model`` was queued: if no worker serves it, have one load it, in the background
        (the request does not wait for the command). Costs a set lookup while a worker serves it (the
        process's last view of the sessions, however old: an attempt reads them afresh)."""
        if not self.enabled or model in self._attempts or model in self._served():
            return
        task = asyncio.create_task(self.ensure(model), name=f"load {model}")
        self._attempts[model] = task
        task.add_done_callback(lambda _: self._attempts.pop(model, None))

    def _served(self) -> set[str]:
        """The models some worker serves in the last view of the sessions (computed once per view)."""
        snapshot = self._sessions.latest()
        if snapshot is None:
            return set()
        if self._served_in is None or self._served_in[0] is not snapshot:
            served = {s.serves for s in snapshot.sessions.values() if s.serves is not None}
            self._served_in = (snapshot, served)
        return self._served_in[1]

    async def ensure(self, model: str, reason: str = "on_demand") -> str | None:
        """If nobody serves or loads ``model``, tell the best worker to load it; its session id, or None
        (none needed, none may, or the command was refused: the fleet pass tries again)."""
        lock = f"fleet-load:{model}"
        ttl = self._settings.model_switch_reply_timeout + 5.0
        try:
            if not await self._broker.acquire_lock(lock, self.owner, ttl=ttl):
                return None  # another replica or request is at it
        except BrokerError as exc:
            logger.warning("cannot load {} on demand now: {}", model, exc)
            return None
        try:
            return await self._ensure_locked(model, reason)
        except (BrokerError, DomainError) as exc:
            logger.warning("loading {} on demand failed: {}", model, exc)
            return None
        finally:
            with contextlib.suppress(Exception):
                await self._broker.release_lock(lock, self.owner)

    async def _ensure_locked(self, model: str, reason: str) -> str | None:
        sessions = (await self._sessions.snapshot(fresh=True)).sessions
        if loaded_or_loading(model, sessions.values()):
            return None
        candidates = [s for s in sessions.values() if s.can_load(model)]
        queued = await self._queue_lengths(s.model_config_.name for s in candidates if s.loaded)
        chosen = worker_to_load(
            model,
            sessions,
            queued,
            now=time.time(),
            retry_backoff=self._settings.load_retry_backoff,
            trusted_only_models=self._settings.trusted_workers_only_models,
        )
        if chosen is None:
            logger.info("no worker can load {} now: it waits in the queue", model)
            return None
        await self._switcher.load(chosen, model, reason)
        return chosen

    async def _queue_lengths(self, models: Iterable[str]) -> dict[str, int]:
        return {
            model: await self._broker.queue_length(events.work_queue_name(model)) for model in set(models)
        }

    # ------------------------------------------------------------ the fleet pass
    async def run(self) -> None:
        interval = self._settings.fleet_interval
        while not self.stopping.is_set():
            try:
                if await self._broker.acquire_lock(PASS_LOCK, self.owner, ttl=interval * 3):
                    await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the pass must survive a broker outage
                logger.warning("fleet pass failed: {}: {}", type(exc).__name__, exc)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), timeout=interval)

    async def stop(self) -> None:
        self.stopping.set()
        for task in list(self._attempts.values()):
            task.cancel()
        with contextlib.suppress(Exception):
            await self._broker.release_lock(PASS_LOCK, self.owner)

    async def tick(self) -> None:
        sessions = (await self._sessions.snapshot(fresh=True)).sessions
        if not any(s.switchable for s in sessions.values()):
            return
        if self.enabled:
            await self._load_waiting(sessions)
        await self._unload_idle(sessions)

    async def _load_waiting(self, sessions: dict[str, WorkerSession]) -> None:
        """Models with queued work that nobody serves or loads: try a load again."""
        waiting = await self._queue_lengths(models_to_load(sessions.values()))
        for model, length in sorted(waiting.items()):
            if length > 0:
                await self.ensure(model, reason="on_demand")

    async def _unload_idle(self, sessions: dict[str, WorkerSession]) -> None:
        queued = await self._queue_lengths(keep_alive_models(sessions))
        for session_id, model in idle_past_keep_alive(sessions, queued, time.time()):
            try:
                await self._switcher.unload(session_id, reason="keep_alive", only_if_idle=True)
            except DomainError as exc:
                logger.info("worker {} keeps {}: {}", session_id, model, exc.detail)
