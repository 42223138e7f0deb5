"""What every part of a worker connection shares: the worker's description, its in-flight messages
(:mod:`.in_flight`), its capacity as the dispatcher sees it, and sending frames, storing outcomes
durably and publishing the session. The parts: :mod:`.job_sending`, :mod:`.frame_receiving`, and the
connection's lifetime (:mod:`.worker_connection`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, KeysView
from dataclasses import dataclass, field
from typing import TypeVar

from fastapi import WebSocket
from loguru import logger
from pydantic import BaseModel

from oasst_inference_server import metrics
from oasst_inference_server.broker import Broker, BrokerError, WorkerSession
from oasst_inference_server.broker.worker_session import ServableSummary, SwitchOutcome, SwitchState
from oasst_inference_server.dispatch.message_lifecycle import MessageLifecycle
from oasst_inference_server.moderation.hook import Moderation
from oasst_inference_server.outages import is_outage
from oasst_inference_server.scheduling.capacity import WorkerCapacity
from oasst_inference_server.scheduling.dispatcher import Dispatchers, ModelDispatcher
from oasst_inference_server.settings import Settings
from oasst_inference_server.workers.claim_gate import ClaimGate
from oasst_inference_server.workers.compliance_hooks import Checked, ComplianceHooks
from oasst_inference_server.workers.compliance_rules import SpotChecks
from oasst_inference_server.workers.compliance_store import ComplianceRecorder
from oasst_inference_server.workers.in_flight import InFlight, InFlightMessages
from oasst_inference_server.workers.key_limits import KeyLimits
from oasst_inference_server.workers.token_relay import TokenRelay
from oasst_inference_server.workers.trust import WorkerTrust
from oasst_inference_server.workers.worker_calls import WorkerCalls
from oasst_shared.protocol import (
    CLOSE_POLICY_VIOLATION,
    CONTINUATION_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    SWITCHING_PROTOCOL_VERSION,
    TOKENIZE_PROTOCOL_VERSION,
    EmbedWork,
    ModelSwitch,
    Work,
    WorkerInfo,
    dump_frame,
    dump_work,
)

# Waiting out a database or broker outage inside the connection: first and longest pause.
_OUTAGE_MIN_DELAY = 0.2
_OUTAGE_MAX_DELAY = 2.0

T = TypeVar("T")


# The metrics' model label of a worker whose backend holds no model.
UNLOADED_LABEL = "(unloaded)"


@dataclass
class Switch:
    """A switch this connection's worker was told to make (protocol 6), until its new ``worker_info``."""

    state: SwitchState  # as the session record shows it
    started: float = field(default_factory=time.monotonic)
    frames: int = 0  # model_switch frames received
    published_at: float = 0.0  # when its progress was last published (monotonic)


class ConnectionClosed(Exception):
    """Ends the connection with this close code and reason."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason


class ConnectionCore:
    model_name: str
    _dispatcher: ModelDispatcher | None

    def __init__(
        self,
        websocket: WebSocket,
        info: WorkerInfo,
        *,
        settings: Settings,
        broker: Broker,
        lifecycle: MessageLifecycle,
        dispatcher: ModelDispatcher,
        protocol_version: int = PROTOCOL_VERSION,
        worker_id: str | None = None,
        trust: WorkerTrust | None = None,
        compliance: ComplianceRecorder | None = None,
        spot_checks: SpotChecks | None = None,
        dispatchers: Dispatchers | None = None,
        key_limits: KeyLimits | None = None,
        moderation: Moderation | None = None,
    ):
        self.websocket = websocket
        self.worker_id = worker_id
        self.trust = trust or WorkerTrust()
        self.info = info
        self.protocol_version = protocol_version
        self.session_id = f"ws-{uuid.uuid4().hex[:20]}"
        self.model_name = info.model_config_.name
        self._key_limits = key_limits or KeyLimits(max_slots=settings.max_slots_per_worker)
        # Protocol 6: what the worker can switch to (what its key allows of what it lists), whether its
        # backend holds a model, the switch it is making and how its last one ended.
        self.servable = self._key_limits.servable(info, protocol_version)
        self.loaded = info.loaded or protocol_version < SWITCHING_PROTOCOL_VERSION
        self.switch: Switch | None = None
        self.last_switch: SwitchOutcome | None = None
        # Since when it holds no work (Unix time; None while it holds some): keep_alive counts from it.
        self.idle_since: float | None = time.time()
        self._settings = settings
        self._broker = broker
        self._lifecycle = lifecycle
        # The moderation hook on answers (:mod:`.answer_moderation`); None unless it checks answers, so a
        # token costs nothing more while moderation is off.
        self._moderation = moderation if moderation is not None and moderation.on_answers else None
        self._compliance = ComplianceHooks(
            Checked(worker_id, self.session_id, self.model_name),
            self.trust,
            settings,
            compliance,
            spot_checks,
        )
        # The messages this worker holds, one record each (:mod:`.in_flight`).
        self._held = InFlightMessages()
        self.backend_healthy = True
        self.draining = False
        # What the dispatcher ranks this worker by; ``in_flight`` there counts assigned jobs too.
        self.capacity = WorkerCapacity(self.session_id, declared_slots=info.max_parallel_requests)
        # Assigned jobs: (message id, its max_new_tokens if the dispatcher knew it).
        self._assigned: asyncio.Queue[tuple[str, int | None]] = asyncio.Queue()
        self._claiming = 0
        # Set when a job handed over in a submission's transaction could not be sent: ends the connection.
        self._broken: asyncio.Future[ConnectionClosed | None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        # The dispatcher of the model it serves; None while its backend holds no model.
        self._dispatcher = dispatcher if self.loaded else None
        self._dispatchers = dispatchers
        # Set once the session's command channel is subscribed (commands published before are lost).
        self.commands_ready = asyncio.Event()
        self._send_lock = asyncio.Lock()
        self._last_pong = time.monotonic()
        self.connected_at = time.time()
        # Set while a step waits out a storage outage: the worker is not the one that is silent.
        self._waiting_for_storage = False
        # Resolved once: labels() is a locked dict lookup, and this counter moves on every token.
        self._tokens_relayed = metrics.TOKENS.labels(self.model_name)
        self._relay = TokenRelay(broker, label=f" of worker {self.session_id}")
        # Jobs sent before their claim was committed (:mod:`.claim_gate`).
        self._gate = ClaimGate()
        # Questions to the worker (tokenize, detokenize) waiting for their answers (:mod:`.worker_calls`).
        self.calls = WorkerCalls(self._send)
        # The session record last written and when (monotonic): a pong writes only a change or a refresh.
        self._published_session: WorkerSession | None = None
        self._published_at = 0.0
        self._capacity_changed_quietly()

    # ------------------------------------------------------------ public
    @property
    def in_flight(self) -> KeysView[str]:
        """The ids of the messages this worker holds."""
        return self._held.ids()

    @property
    def free_slots(self) -> int:
        return self.capacity.free_slots

    @property
    def tokenizes(self) -> bool:
        """The worker counts prompts for the server (protocol 4, and it said it does)."""
        return self.protocol_version >= TOKENIZE_PROTOCOL_VERSION and self.info.capabilities.tokenize

    @property
    def continues_answers(self) -> bool:
        """The worker continues an answer a lost worker started (protocol 5, and it said it does)."""
        return (
            self.protocol_version >= CONTINUATION_PROTOCOL_VERSION and self.info.capabilities.continue_answer
        )

    @property
    def switchable(self) -> bool:
        """The server may tell it to load or unload (protocol 6, and it lists what it can load)."""
        return self.protocol_version >= SWITCHING_PROTOCOL_VERSION and bool(self.servable)

    @property
    def switching(self) -> bool:
        return self.switch is not None

    @property
    def metric_model(self) -> str:
        return self.model_name if self.loaded else UNLOADED_LABEL

    @property
    def cuts_chat_prompts(self) -> bool:
        """The model config says to cut a chat answer's newest turn that is too long for the model."""
        return self.info.model_config_.chat_prompt_overflow == "cut"

    # ------------------------------------------------------------ capacity
    def _count_slot(self, taken: int) -> None:
        """A slot taken (1) or given back (-1) before the next recount: counted at once, so that the
        dispatcher never places two jobs on one free slot."""
        self.capacity.in_flight += taken
        if self.capacity.reported_free_slots is not None:
            self.capacity.reported_free_slots -= taken

    def _capacity_changed_quietly(self) -> None:
        # A worker told to switch takes nothing new from then until its new worker_info.
        self.capacity.available = (
            self.backend_healthy and not self.draining and self.loaded and self.switch is None
        )
        self.capacity.in_flight = (
            len(self._held) + self._assigned.qsize() + self._claiming + len(self._compliance)
        )
        if self.capacity.in_flight:
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = time.time()
        self.capacity.takes_user_work = self.trust.may_take_user_work(
            self.model_name, self._settings.trusted_workers_only_models
        )
        self.capacity.trusted = self.trust.trusted and not self.trust.flagged

    def _backend_health(self, healthy: bool) -> bool:
        """Set whether the worker's backend is healthy; True if that changed."""
        changed = healthy != self.backend_healthy
        self.backend_healthy = healthy
        return changed

    def _capacity_changed(self) -> None:
        self._capacity_changed_quietly()
        if self._dispatcher is not None:
            self._dispatcher.capacity_changed()

    # ------------------------------------------------------------ in-flight records
    def _start(self, message_id: str, work: Work | EmbedWork) -> None:
        """Count a claimed job as the worker's before its frame is sent: its record starts here."""
        spot_checked = isinstance(work, Work) and self._compliance.spot_checked(work)
        self._held.add(InFlight.claimed(message_id, work, spot_checked=spot_checked))
        self._gate.opened(message_id)
        self._capacity_changed()
        metrics.DISPATCHED.labels(self.model_name).inc()
        metrics.IN_FLIGHT.labels(self.model_name).inc()

    def _done(self, message_id: str) -> None:
        """A job's slot is free: its record (if it still had one) ends here. Its slot, and the KV cache it
        may have held, are counted free at once: a worker whose last pong said its KV cache was full (all
        its slots busy) takes the next job now rather than at its next pong, seconds later. The next
        pong says again what is free."""
        record = self._held.remove(message_id)
        if record is not None:
            metrics.IN_FLIGHT.labels(self.model_name).dec()
            if self.capacity.kv_cache_free_tokens is not None:
                self.capacity.kv_cache_free_tokens += record.kv_room()
        if self.capacity.reported_free_slots is not None:
            self.capacity.reported_free_slots += 1
        self._capacity_changed()

    # ------------------------------------------------------------ model switches (:mod:`.model_switching`)
    async def _on_worker_info(self, info: WorkerInfo) -> None:
        raise ConnectionClosed(CLOSE_POLICY_VIOLATION, "worker_info may only be the first frame")

    async def _on_model_switch(self, frame: ModelSwitch) -> None:
        raise ConnectionClosed(CLOSE_POLICY_VIOLATION, "model_switch without a load_model or unload_model")

    # ------------------------------------------------------------ storage and the socket
    async def _durably(self, step: Callable[[], Awaitable[T]], what: str) -> T | None:
        """Run a storage step, waiting out an outage of the database or broker (retrying with backoff
        for up to ``lease_seconds``) instead of ending the connection; None if it never succeeded."""
        delay = _OUTAGE_MIN_DELAY
        deadline = time.monotonic() + self._settings.lease_seconds
        while True:
            try:
                return await step()
            except Exception as exc:
                if not is_outage(exc) or time.monotonic() + delay > deadline:
                    logger.error(
                        "worker {}: {} failed: {}: {}", self.session_id, what, type(exc).__name__, exc
                    )
                    return None
                logger.warning(
                    "worker {}: {} waits for storage: {}", self.session_id, what, type(exc).__name__
                )
                self._waiting_for_storage = True
                try:
                    await asyncio.sleep(delay)
                finally:
                    self._waiting_for_storage = False
                delay = min(delay * 2, _OUTAGE_MAX_DELAY)

    async def _send(self, frame: BaseModel) -> None:
        await self._send_text(
            dump_work(frame, self.protocol_version) if isinstance(frame, Work) else dump_frame(frame)
        )

    async def _send_quietly(self, frame: BaseModel) -> None:
        with contextlib.suppress(Exception):
            await self._send(frame)

    async def _send_text(self, text: str) -> None:
        """Send one frame; a worker that does not read its socket (the send cannot complete within
        ``worker_send_timeout``) is disconnected: it would otherwise hold this task, and the database
        connection of a claim whose job is being sent, for as long as it likes."""
        try:
            async with asyncio.timeout(self._settings.worker_send_timeout), self._send_lock:
                await self.websocket.send_text(text)
        except TimeoutError:
            logger.warning(
                "worker {}: a frame could not be sent in {:.0f}s: disconnecting it",
                self.session_id,
                self._settings.worker_send_timeout,
            )
            raise ConnectionClosed(CLOSE_POLICY_VIOLATION, "the worker does not read its socket") from None

    async def _publish_session(self, *, if_changed: bool = False) -> None:
        """Write the session record (its TTL twice the ping timeout). ``if_changed`` (a pong): only when it
        differs from the last one written, or that one has lived half its TTL, or a read of the sessions
        missed it (Redis flushed): a thousand workers' pongs that report what their records already say
        cost the broker no write."""
        session = WorkerSession(
            model_config=self.info.model_config_,
            max_parallel_requests=self.info.max_parallel_requests,
            free_slots=self.free_slots,
            in_flight=sorted(self.in_flight),
            backend_kind=self.info.backend_kind,
            backend_healthy=self.backend_healthy,
            draining=self.draining,
            worker_version=self.info.worker_version,
            capabilities=self.info.capabilities,
            connected_at=self.connected_at,
            kv_cache_free_tokens=self.capacity.kv_cache_free_tokens,
            backend_queue_length=self.capacity.backend_queue_length,
            tokens_per_second=self.capacity.tokens_per_second,
            worker_id=self.worker_id,
            backend_model_id=self.info.backend_model_id,
            backend_model_revision=self.info.backend_model_revision,
            backend_version=self.info.backend_version,
            trusted=self.trust.trusted,
            flagged=self.trust.flagged,
            switchable=self.switchable,
            servable=[ServableSummary.of(s) for s in self.servable.values()],
            loaded=self.loaded,
            switch=self.switch.state if self.switch is not None else None,
            last_switch=self.last_switch,
            idle_since=self.idle_since,
        )
        ttl = self._settings.worker_ping_timeout * 2
        now = time.monotonic()
        if (
            if_changed
            and session == self._published_session
            and now - self._published_at < ttl / 2
            and not self._broker.lost_here(self.session_id)  # Redis flushed: not what it holds now
        ):
            return
        try:
            await self._broker.put_worker_session(session.record(self.session_id), ttl=ttl)
        except BrokerError as exc:
            logger.warning("worker {}: session not published: {}", self.session_id, exc)
            self._published_session = None  # the next pong tries again
            return
        self._published_session, self._published_at = session, now
