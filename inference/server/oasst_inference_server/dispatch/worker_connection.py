"""One connected worker: dispatch work to it, relay its tokens, watch its health.

Five tasks run per connection and the first to end ends them all:

* ``_receive``  - parses worker frames; a refused frame fails only the messages it names (a frame that
  names none closes the socket with 1008);
* the relay     - writes the tokens ``_receive`` hands it to the broker in batches (:mod:`.token_relay`);
* ``_dispatch`` - claims and sends the jobs its model's dispatcher (:mod:`.dispatcher`) assigns it;
* ``_ping``     - pings; a worker silent past ``worker_ping_timeout`` is disconnected;
* ``_commands`` - forwards commands (cancel) that any replica published for this session, and has the
  worker answer other replicas' questions (:mod:`.remote_questions`).

Faults stay as small as their cause: a message that cannot be sent or whose frames are refused fails
alone; a database or broker outage is waited out (each step is retried) and never closes the socket.
When the connection ends, every message it still held is released for a retry elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from fastapi import WebSocket
from loguru import logger
from pydantic import BaseModel
from sqlmodel.ext.asyncio.session import AsyncSession
from starlette.websockets import WebSocketDisconnect, WebSocketState

from oasst_inference_server import metrics
from oasst_inference_server.broker import Broker, BrokerError, WorkerSession
from oasst_inference_server.db.models import DbMessage
from oasst_inference_server.dispatch import events
from oasst_inference_server.dispatch.capacity import WorkerCapacity
from oasst_inference_server.dispatch.claim_gate import ClaimGate, named_messages
from oasst_inference_server.dispatch.compliance_rules import ProbeOutcome, SpotChecks
from oasst_inference_server.dispatch.compliance_store import (
    FAILED,
    FLAG_COMMAND,
    CheckResult,
    ComplianceRecorder,
)
from oasst_inference_server.dispatch.dispatcher import ModelDispatcher
from oasst_inference_server.dispatch.embedding_parts import EmbeddingAssembly, PartRefused
from oasst_inference_server.dispatch.message_lifecycle import MessageLifecycle, UnsendableMessage
from oasst_inference_server.dispatch.remote_questions import answer_question, is_question
from oasst_inference_server.dispatch.token_relay import TokenRelay
from oasst_inference_server.dispatch.trust import WorkerTrust
from oasst_inference_server.dispatch.worker_calls import WorkerCalls
from oasst_inference_server.dispatch.worker_frames import (
    ReceivedFrame,
    Salvaged,
    bounded_usage,
    parse_or_salvage,
    salvage,
    token_cap,
    utf8_size,
)
from oasst_inference_server.outages import is_outage
from oasst_inference_server.settings import Settings
from oasst_shared.protocol import (
    CLOSE_GOING_AWAY,
    CLOSE_INTERNAL_ERROR,
    CLOSE_MESSAGE_TOO_BIG,
    CLOSE_POLICY_VIOLATION,
    CLOSE_UNAUTHORIZED,
    CLOSE_UNSUPPORTED_DATA,
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    TOKENIZE_PROTOCOL_VERSION,
    Cancel,
    Detokenized,
    Drain,
    Embeddings,
    EmbeddingsPart,
    EmbedWork,
    GeneratedText,
    Ping,
    Pong,
    ProtocolError,
    Tokenize,
    Tokenized,
    Work,
    WorkerError,
    WorkerInfo,
    dump_frame,
    dump_work,
    frame_bytes,
    parse_server_frame,
)
from oasst_shared.token_frames import TokenFrame, TokenFrames

# Waiting out a database or broker outage inside the connection: first and longest pause.
_OUTAGE_MIN_DELAY = 0.2
_OUTAGE_MAX_DELAY = 2.0

T = TypeVar("T")

# Published on a session's command channel to close that socket from any replica (key revoked).
DISCONNECT_COMMAND = '{"type":"disconnect"}'


class _ConnectionClosed(Exception):
    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass
class _Probe:
    done: asyncio.Future[ProbeOutcome]
    limit: int  # token frames kept (worker_frames.token_cap)
    tokens: list[str] = field(default_factory=list)


class WorkerConnection:
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
    ):
        self.websocket = websocket
        self.worker_id = worker_id
        self.trust = trust or WorkerTrust()
        self._compliance = compliance
        # Compliance checks in flight: message id -> the check. They are never stored as messages, so
        # they reach no user and count in no usage or fair share; on the wire they are plain work.
        self._probes: dict[str, _Probe] = {}
        # User jobs drawn for a spot check: their streamed token texts, compared after the fact.
        self._spot_checks = spot_checks
        self._spot_tokens: dict[str, list[str]] = {}
        self.info = info
        self.protocol_version = protocol_version
        self.session_id = f"ws-{uuid.uuid4().hex[:20]}"
        self.model_name = info.model_config_.name
        self._settings = settings
        self._broker = broker
        self._lifecycle = lifecycle
        self.in_flight: set[str] = set()
        self.backend_healthy = True
        self.draining = False
        # What the dispatcher ranks this worker by; ``in_flight`` there counts assigned jobs too.
        self.capacity = WorkerCapacity(self.session_id, declared_slots=info.max_parallel_requests)
        # Assigned jobs: (message id, its max_new_tokens if the dispatcher knew it).
        self._assigned: asyncio.Queue[tuple[str, int | None]] = asyncio.Queue()
        self._claiming = 0
        # Set when a job handed over in a submission's transaction could not be sent: ends the connection.
        self._broken: asyncio.Future[_ConnectionClosed | None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._dispatcher = dispatcher
        self._send_lock = asyncio.Lock()
        self._last_pong = time.monotonic()
        self.connected_at = time.time()
        self._dispatched_at: dict[str, float] = {}
        # Per in-flight message: the work sent and the bytes of text streamed (to bound usage claims).
        self._work: dict[str, Work] = {}
        self._streamed_bytes: dict[str, int] = {}
        # Token frames taken per user job, bounded by worker_frames.token_cap (the rest are dropped).
        self._token_frames: dict[str, int] = {}
        # Embedding jobs: the vectors received so far of results sent in parts (protocol 4).
        self._embeddings: dict[str, EmbeddingAssembly] = {}
        # Set while a step waits out a storage outage: the worker is not the one that is silent.
        self._waiting_for_storage = False
        # Resolved once: labels() is a locked dict lookup, and this counter moves on every token.
        self._tokens_relayed = metrics.TOKENS.labels(self.model_name)
        self._first_token_at: dict[str, float] = {}
        self._relay = TokenRelay(broker, label=f" of worker {self.session_id}")
        # Jobs sent before their claim was committed (:mod:`.claim_gate`).
        self._gate = ClaimGate()
        # Questions to the worker (tokenize, detokenize) waiting for their answers (:mod:`.worker_calls`).
        self.calls = WorkerCalls(self._send)
        self._capacity_changed_quietly()

    # ------------------------------------------------------------ public
    @property
    def free_slots(self) -> int:
        return self.capacity.free_slots

    @property
    def tokenizes(self) -> bool:
        """The worker counts prompts for the server (protocol 4, and it said it does)."""
        return self.protocol_version >= TOKENIZE_PROTOCOL_VERSION and self.info.capabilities.tokenize

    @property
    def cuts_chat_prompts(self) -> bool:
        """The model config says to cut a chat answer's newest turn that is too long for the model."""
        return self.info.model_config_.chat_prompt_overflow == "cut"

    async def tokenize(self, question: Tokenize, timeout: float) -> Tokenized:
        """Ask the worker's backend to tokenize; raises ``CallFailed`` without a usable answer."""
        answer = await self.calls.ask(question, timeout)
        assert isinstance(answer, Tokenized)  # ask() checks that the answer is of the question's kind
        return answer

    def assign(self, message_id: str, max_new_tokens: int | None = None) -> None:
        """Reserve a slot for ``message_id`` (the dispatcher chose this worker); ``_dispatch`` sends it.
        ``max_new_tokens``, where the dispatcher knows it, lets the claim set the generation deadline in
        its one UPDATE."""
        self._count_slot(1)
        self._assigned.put_nowait((message_id, max_new_tokens))

    def reserve(self) -> None:
        """Reserve a slot for a job a submission will hand over in its own transaction
        (:meth:`hand_over`); :meth:`unreserve` gives it back if the job is not handed over after all."""
        self._claiming += 1
        self._count_slot(1)

    def unreserve(self) -> None:
        self._claiming -= 1
        self._count_slot(-1)
        self._capacity_changed()

    def _count_slot(self, taken: int) -> None:
        """A slot taken (1) or given back (-1) before the next recount: counted at once, so that the
        dispatcher never places two jobs on one free slot."""
        self.capacity.in_flight += taken
        if self.capacity.reported_free_slots is not None:
            self.capacity.reported_free_slots -= taken

    async def hand_over(
        self,
        session: AsyncSession,
        message: DbMessage,
        permit: Awaitable[bool],
        known: Sequence[DbMessage] = (),
    ) -> bool:
        """Claim ``message`` (pending in ``session``'s open transaction, not yet written) for this worker
        and send it before the caller commits, if ``permit`` (awaited once the frame is ready) says so;
        the slot was reserved. True: sent, and the caller must report its commit's outcome with
        :meth:`handed`. False: not sent, the message left pending and the slot given back (the caller
        queues the message)."""
        message_id = message.id
        try:
            claimed = await self._lifecycle.claim_unsaved(
                session,
                message,
                self.session_id,
                max_input_tokens=self.info.model_config_.max_input_length,
                protocol_version=self.protocol_version,
                known=known,
                cut_chat_prompts=self.cuts_chat_prompts,
            )
        except BaseException:
            self.unreserve()
            raise
        if claimed is None:  # no frame can carry it: queued, its claim then fails it as for any message
            self.unreserve()
            return False
        try:
            permitted = await permit
        except BaseException:
            self._lifecycle.unclaim_unsaved(message)
            self.unreserve()
            raise
        if not permitted:
            self._lifecycle.unclaim_unsaved(message)
            self.unreserve()
            return False
        self._claiming -= 1
        self._start(message_id, claimed.work)
        # Shielded: a request cancelled mid-send must not leave it unknown whether the worker has the job.
        send = asyncio.ensure_future(self._send_text(claimed.frame))
        try:
            await asyncio.shield(send)
        except asyncio.CancelledError:
            # The caller's transaction will not commit: the job is void once its frame is out.
            self._gate.settled(message_id, void=True)
            send.add_done_callback(functools.partial(self._void_sent, message_id))
            raise
        except Exception as exc:
            self._gate.settled(message_id)
            self._done(message_id)
            self._lifecycle.unclaim_unsaved(message)
            if self._broken is not None and not self._broken.done():
                closed = exc if isinstance(exc, _ConnectionClosed) else None
                self._broken.set_result(closed or _ConnectionClosed(CLOSE_GOING_AWAY, "socket closed"))
            return False
        return True

    def _void_sent(self, message_id: str, send: asyncio.Future[None]) -> None:
        """A void job's send ended: if the worker got it, it is told to cancel (its answer frees the
        slot); if not, the slot is free now."""
        if send.cancelled() or send.exception() is not None:
            self._gate.void.discard(message_id)
            self._done(message_id)
            return
        task = asyncio.create_task(self._send_quietly(Cancel(message_id=message_id)))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _send_quietly(self, frame: BaseModel) -> None:
        with contextlib.suppress(Exception):
            await self._send(frame)

    async def handed(self, message_id: str, *, committed: bool) -> None:
        """The outcome of the commit after :meth:`hand_over` sent ``message_id``: confirmed, or void
        (the worker is told to cancel it; nothing it sends for it is kept)."""
        if committed:
            self._gate.settled(message_id)
            logger.info(
                "message {} -> worker {} (attempt 1, handed over at once)", message_id, self.session_id
            )
            await self._publish_session()
            return
        self._gate.settled(message_id, void=True)
        self._capacity_changed()
        logger.warning(
            "worker {}: the submission of {} did not commit: cancelling it", self.session_id, message_id
        )
        await self._send_quietly(Cancel(message_id=message_id))

    def _capacity_changed_quietly(self) -> None:
        self.capacity.available = self.backend_healthy and not self.draining
        self.capacity.in_flight = (
            len(self.in_flight) + self._assigned.qsize() + self._claiming + len(self._probes)
        )
        self.capacity.takes_user_work = self.trust.may_take_user_work(
            self.model_name, self._settings.trusted_workers_only_models
        )
        self.capacity.trusted = self.trust.trusted and not self.trust.flagged

    def _capacity_changed(self) -> None:
        self._capacity_changed_quietly()
        self._dispatcher.capacity_changed()

    async def probe(self, work: Work, timeout: float) -> ProbeOutcome:
        """Send a compliance check's job and collect its answer; inconclusive on a timeout, an error of
        the worker or its backend, or a lost socket (an honest but slow worker is never blamed)."""
        loop = asyncio.get_running_loop()
        probe = _Probe(loop.create_future(), token_cap(work))
        self._probes[work.message_id] = probe
        if self.capacity.reported_free_slots is not None:
            self.capacity.reported_free_slots -= 1
        self._capacity_changed()
        try:
            await self._send(work)
            return await asyncio.wait_for(asyncio.shield(probe.done), timeout)
        except asyncio.TimeoutError:
            with contextlib.suppress(Exception):
                await self._send(Cancel(message_id=work.message_id))
            return ProbeOutcome(None, "", 0, f"no answer within {timeout:.0f}s")
        except (RuntimeError, WebSocketDisconnect) as exc:
            return ProbeOutcome(None, "", 0, f"could not send the job: {exc}")
        finally:
            self._probes.pop(work.message_id, None)
            if self.capacity.reported_free_slots is not None:
                self.capacity.reported_free_slots += 1
            self._capacity_changed()

    def _finish_probe(self, message_id: str, outcome: ProbeOutcome) -> None:
        probe = self._probes.get(message_id)
        if probe is not None and not probe.done.done():
            probe.done.set_result(outcome)

    async def flag(self, reason: str) -> None:
        """Its key failed compliance checks: no more user work; what it holds finishes normally."""
        if self.trust.flagged:
            return
        self.trust.flagged, self.trust.flag_reason = True, reason
        logger.warning("worker {} is flagged and gets no user work: {}", self.session_id, reason)
        self._capacity_changed()
        await self._publish_session()

    async def run(self) -> None:
        metrics.WORKERS_CONNECTED.labels(self.model_name).inc()
        await self._publish_session()
        self._dispatcher.attach(self)
        logger.info(
            "worker {} connected: model {}, {} slots, backend {}",
            self.session_id,
            self.model_name,
            self.info.max_parallel_requests,
            self.info.backend_kind,
        )
        tasks = [
            asyncio.create_task(self._guard(self._receive), name="receive"),
            asyncio.create_task(self._guard(self._dispatch), name="dispatch"),
            asyncio.create_task(self._guard(self._ping), name="ping"),
            asyncio.create_task(self._guard(self._commands), name="commands"),
            asyncio.create_task(self._guard(self._relay.run), name="relay"),
        ]
        broken: asyncio.Future[_ConnectionClosed | None] = asyncio.get_running_loop().create_future()
        self._broken = broken
        watched: list[asyncio.Future[_ConnectionClosed | None]] = [*tasks, broken]
        close: _ConnectionClosed | None = None
        try:
            done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                result = task.result()
                if isinstance(result, _ConnectionClosed):
                    close = result
        finally:
            broken.cancel()
            for task in tasks:
                task.cancel()
            # Bounded: a task stuck in a broker call must not keep the worker's messages hostage.
            _, stuck = await asyncio.wait(tasks, timeout=2.0)
            if stuck:
                logger.warning("worker {}: {} tasks did not stop in time", self.session_id, len(stuck))
            await self._cleanup(close)

    # ------------------------------------------------------------ tasks
    async def _guard(self, task: Callable[[], Awaitable[None]]) -> _ConnectionClosed | None:
        try:
            await task()
        except _ConnectionClosed as closed:
            return closed
        except WebSocketDisconnect as exc:
            return _ConnectionClosed(exc.code, "worker disconnected")
        except BrokerError as exc:  # a RuntimeError too, but not a closed socket
            logger.opt(exception=exc).error("worker {}: broker error escaped a task", self.session_id)
            return _ConnectionClosed(CLOSE_GOING_AWAY, "server error")
        except RuntimeError as exc:  # starlette: send/receive on a closed socket
            return _ConnectionClosed(CLOSE_GOING_AWAY, f"socket closed: {exc}")
        except Exception as exc:  # a bug: end this connection (its messages are retried), not the server
            logger.opt(exception=exc).error("worker {}: task failed", self.session_id)
            return _ConnectionClosed(CLOSE_INTERNAL_ERROR, "server error")
        return None

    async def _receive(self) -> None:
        while True:
            received = await self.websocket.receive()
            if received["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(received.get("code", 1000))
            text = received.get("text")
            if text is None:
                raise _ConnectionClosed(CLOSE_UNSUPPORTED_DATA, "binary frames are not part of the protocol")
            # Any frame proves the worker alive: under load its pongs queue behind token frames.
            self._last_pong = time.monotonic()
            if frame_bytes(text) > MAX_FRAME_BYTES:  # the ASGI server's max size is the first guard
                too_big = f"frame over the limit of {MAX_FRAME_BYTES} bytes"
                await self._refuse(salvage(text, too_big), too_big, CLOSE_MESSAGE_TOO_BIG)
                continue
            frame, salvaged, error = parse_or_salvage(text)
            if frame is None:
                await self._refuse(salvaged, error or "malformed frame", CLOSE_POLICY_VIOLATION)
                continue
            await self._handle(frame)

    async def _refuse(self, salvaged: Salvaged | None, error: str, close_code: int) -> None:
        """A frame the protocol refuses: its messages fail alone; a frame naming none closes the socket."""
        metrics.ERRORS.labels("protocol").inc()
        if salvaged is None:
            logger.warning("worker {} sent a malformed frame: {}", self.session_id, error)
            raise _ConnectionClosed(close_code, f"malformed frame: {error}"[:120])
        for part in salvaged.frames:
            await self._handle(part)
        for request_id, why in salvaged.calls.items():
            logger.warning("worker {}: refused its answer to {}: {}", self.session_id, request_id, why)
            self.calls.refused(request_id, why)
        await self._gate.wait(salvaged.refused)
        for message_id, why in salvaged.refused.items():
            await self._fail_refused(message_id, why)

    async def _fail_refused(self, message_id: str, why: str) -> None:
        """Fail a message the worker sent a refused frame for (only it: the connection goes on)."""
        if message_id not in self.in_flight:
            return
        logger.warning("worker {}: refused a frame of message {}: {}", self.session_id, message_id, why)
        await self._relay.flush()
        self._done(message_id)
        reason = f"the worker sent a frame the server refuses ({why})"[:500]
        await self._durably(
            functools.partial(self._lifecycle.release, message_id, self.session_id, reason, retryable=False),
            f"failing message {message_id}",
        )

    async def _handle(self, frame: ReceivedFrame) -> None:
        """One valid frame. A storage outage is waited out here; any other fault of one message's frame
        fails that message, never the connection."""
        message_id = getattr(frame, "message_id", None)
        if self._gate.open:  # else no message id set is built per token frame
            await self._gate.wait(named_messages(frame))
        try:
            if self._gate.void and await self._ended_void(frame):
                return
            await self._dispatch_frame(frame)
        except (_ConnectionClosed, WebSocketDisconnect, asyncio.CancelledError):
            raise
        except Exception as exc:
            if isinstance(exc, RuntimeError) and not isinstance(exc, BrokerError):
                raise  # starlette: the socket is closed
            logger.opt(exception=exc).error(
                "worker {}: handling a {} frame failed", self.session_id, type(frame).__name__
            )
            if isinstance(message_id, str) and message_id in self.in_flight:
                self._done(message_id)
                await self._durably(
                    lambda: self._lifecycle.fail(
                        message_id, "server error while storing the answer", session_id=self.session_id
                    ),
                    f"failing message {message_id}",
                )

    async def _ended_void(self, frame: ReceivedFrame) -> bool:
        """True for a frame that ends a void job (its claim was not confirmed): only its slot is freed,
        and the message retried if the claim did land after all."""
        if not isinstance(frame, (GeneratedText, Embeddings, WorkerError)):
            return False
        message_id = frame.message_id
        if message_id is None or message_id not in self._gate.void:
            return False
        self._gate.void.discard(message_id)
        self._done(message_id)
        await self._durably(
            functools.partial(
                self._lifecycle.release, message_id, self.session_id, "the claim could not be confirmed"
            ),
            f"releasing message {message_id}",
        )
        return True

    async def _dispatch_frame(self, frame: ReceivedFrame) -> None:
        if isinstance(frame, TokenFrames):  # a token frame or a batch: the same tokens alike
            for token in frame.tokens:
                await self._on_token(token)
        elif isinstance(frame, Pong):
            await self._on_pong(frame)
        elif isinstance(frame, GeneratedText):
            probe = self._probes.get(frame.message_id)
            if probe is not None:
                await self._check_usage(
                    frame, frame.model_copy(update={"generated_tokens": len(probe.tokens)})
                )
                self._finish_probe(
                    frame.message_id,
                    ProbeOutcome(probe.tokens, "".join(probe.tokens), frame.generated_tokens, "answered"),
                )
            elif frame.message_id in self.in_flight:
                self._observe_speed(frame.message_id, frame.generated_tokens)
                result = bounded_usage(
                    frame,
                    self._work.get(frame.message_id),
                    self._streamed_bytes.get(frame.message_id, 0),
                )
                await self._check_usage(frame, result)
                spot = self._spot_tokens.get(frame.message_id)
                work_sent = self._work.get(frame.message_id)
                if spot is not None and work_sent is not None and self._spot_checks is not None:
                    if frame.finish_reason in ("length", "eos_token", "stop_sequence"):
                        self._spot_checks.spot_check(self, work_sent, list(spot))
                await self._relay.flush()  # the terminal event comes after every token
                await self._durably(
                    lambda: self._lifecycle.complete(self.session_id, result),
                    f"storing message {frame.message_id}",
                )
                self._done(frame.message_id)
        elif isinstance(frame, EmbeddingsPart):
            assembly = self._embeddings.get(frame.message_id)
            if assembly is not None and frame.message_id not in self._gate.void:
                try:
                    assembly.add(frame)
                except PartRefused as exc:
                    await self._fail_refused(frame.message_id, str(exc))
        elif isinstance(frame, Embeddings):
            if frame.message_id in self.in_flight:
                assembly = self._embeddings.get(frame.message_id)
                try:
                    result = assembly.result(frame) if assembly is not None else frame
                except PartRefused as exc:
                    await self._fail_refused(frame.message_id, str(exc))
                    return
                await self._durably(
                    lambda: self._lifecycle.complete_embeddings(self.session_id, result),
                    f"storing message {frame.message_id}",
                )
                self._done(frame.message_id)
        elif isinstance(frame, WorkerError):
            await self._on_error(frame)
        elif isinstance(frame, (Tokenized, Detokenized)):
            self.calls.answered(frame)
        elif isinstance(frame, Drain):
            logger.info("worker {} is draining ({} in flight)", self.session_id, len(self.in_flight))
            self.draining = True
            self._capacity_changed()
            await self._publish_session()
        elif isinstance(frame, WorkerInfo):
            raise _ConnectionClosed(CLOSE_POLICY_VIOLATION, "worker_info may only be the first frame")

    async def _dispatch(self) -> None:
        while True:
            message_id, max_new_tokens = await self._assigned.get()
            self._claiming += 1
            # How far the job got: "assigned" (no claim), "stale", "claimed" (not sent), "sent".
            stage = "assigned"
            try:
                async with self._lifecycle.open_claim(
                    message_id,
                    self.session_id,
                    max_input_tokens=self.info.model_config_.max_input_length,
                    max_new_tokens=max_new_tokens,
                    protocol_version=self.protocol_version,
                    cut_chat_prompts=self.cuts_chat_prompts,
                ) as claimed:
                    self._claiming -= 1
                    if claimed is None:
                        stage = "stale"  # the message was taken, cancelled or finished meanwhile
                    else:
                        stage = "claimed"
                        self._start(message_id, claimed.work)
                        # Sent before the commit: the row stays locked until then, and the gate holds
                        # back whatever the worker answers until the commit is confirmed.
                        await self._send_text(claimed.frame)
                        stage = "sent"
            except UnsendableMessage as exc:
                # The message itself is at fault: it fails alone; the worker never sees it.
                self._claiming -= 1
                self._capacity_changed()
                metrics.ERRORS.labels("unsendable").inc()
                error = str(exc)
                await self._durably(
                    functools.partial(self._lifecycle.fail, message_id, error), "failing a message"
                )
                continue
            except BaseException as exc:
                await self._claim_failed(message_id, stage, exc)
                if stage == "claimed" or not isinstance(exc, Exception):
                    raise  # the socket failed (or this task is cancelled): the connection ends
                if stage == "assigned":
                    await asyncio.sleep(1.0)  # the database is down: wait before the next claim
                continue
            if stage == "stale":
                self._capacity_changed()
                continue
            self._gate.settled(message_id)
            work = self._work.get(message_id)
            logger.info(
                "message {} -> worker {} (attempt {})",
                message_id,
                self.session_id,
                work.attempt if work is not None else "?",
            )
            await self._publish_session()

    def _start(self, message_id: str, work: Work | EmbedWork) -> None:
        """Count a claimed job as the worker's before its frame is sent."""
        self.in_flight.add(message_id)
        self._gate.opened(message_id)
        self._capacity_changed()
        if isinstance(work, Work):
            self._work[message_id] = work
            if self._spot_checks is not None and not self.trust.trusted and self._spot_checks.wants(work):
                self._spot_tokens[message_id] = []
        else:
            self._embeddings[message_id] = EmbeddingAssembly(len(work.inputs))
        self._dispatched_at[message_id] = time.monotonic()
        metrics.DISPATCHED.labels(self.model_name).inc()
        metrics.IN_FLIGHT.labels(self.model_name).inc()

    async def _claim_failed(self, message_id: str, stage: str, exc: BaseException) -> None:
        """The claim of an assigned job raised at ``stage``: the message must not be lost, nor be
        generated for nothing."""
        if stage == "assigned":
            self._claiming -= 1  # the claim itself failed (the database is down, or a hiccup)
            if isinstance(exc, Exception):
                logger.warning(
                    "worker {}: cannot claim {}: {}: {}", self.session_id, message_id, type(exc).__name__, exc
                )
        elif stage == "claimed":
            # Not sent (the socket failed): the claim rolled back, and the worker has nothing.
            self._gate.settled(message_id)
            self._done(message_id)
        elif stage == "sent":
            # The worker has the job but the commit failed, or its outcome is unknown: it is told to
            # stop, and nothing it sends for the job is kept (the gate makes it void).
            self._gate.settled(message_id, void=True)
            logger.warning(
                "worker {}: the claim of {} was not confirmed ({}): cancelling it",
                self.session_id,
                message_id,
                type(exc).__name__,
            )
            with contextlib.suppress(Exception):
                await self._send(Cancel(message_id=message_id))
        self._capacity_changed()
        # Taken from the queue but not (surely) claimed: put it back. A no-op unless the database
        # says it is pending; a claim that did land is retried when the void job ends (or its lease).
        with contextlib.suppress(Exception):
            await self._lifecycle.requeue(message_id)

    async def _ping(self) -> None:
        while True:
            await asyncio.sleep(self._settings.worker_ping_interval)
            if self._waiting_for_storage:
                self._last_pong = time.monotonic()  # the server is the one stuck, not the worker
            silent_for = time.monotonic() - self._last_pong
            if silent_for > self._settings.worker_ping_timeout:
                logger.warning("worker {} did not answer pings for {:.0f}s", self.session_id, silent_for)
                raise _ConnectionClosed(CLOSE_GOING_AWAY, "ping timeout")
            await self._send(Ping(ping_id=uuid.uuid4().hex[:12]))

    async def _commands(self) -> None:
        """Forward commands; a broker outage is waited out (resubscribing), it does not end the socket.

        A cancel published during an outage is lost here, but not for good: every pong re-sends the
        cancels the database still holds (:meth:`_on_pong`)."""
        while True:
            try:
                await self._forward_commands()
                return  # the broker closed: the server is shutting down
            except BrokerError as exc:
                logger.warning("worker {}: command channel lost, resubscribing: {}", self.session_id, exc)
                await asyncio.sleep(1.0)

    async def _forward_commands(self) -> None:
        async with self._broker.subscribe_commands(
            events.worker_command_channel(self.session_id)
        ) as commands:
            async for data in commands:
                if data == DISCONNECT_COMMAND:
                    raise _ConnectionClosed(CLOSE_UNAUTHORIZED, "the worker's API key was revoked or changed")
                if data == FLAG_COMMAND:
                    await self.flag("its key was flagged on another replica")
                    continue
                if is_question(data):  # another replica asks this worker to count: answered aside
                    task = asyncio.create_task(answer_question(self.calls, self._broker, data))
                    self._background.add(task)
                    task.add_done_callback(self._background.discard)
                    continue
                try:
                    frame = parse_server_frame(data)
                except ProtocolError:
                    logger.error("bad command for worker {}: {}", self.session_id, data[:200])
                    continue
                if isinstance(frame, Cancel) and frame.message_id in self.in_flight:
                    await self._send(frame)

    # ------------------------------------------------------------ frame handlers
    async def _on_token(self, token: TokenFrame) -> None:
        probe = self._probes.get(token.message_id)
        if probe is not None:
            if len(probe.tokens) < probe.limit:
                probe.tokens.append(token.text)
            return
        if token.message_id in self.in_flight and token.message_id not in self._gate.void:
            # (else late, after a cancel or a lost lease, or of a void job: dropped)
            if not self._within_token_cap(token.message_id):
                return
            self._count_token(token.message_id)
            self._streamed_bytes[token.message_id] = self._streamed_bytes.get(
                token.message_id, 0
            ) + utf8_size(token.text)
            spot = self._spot_tokens.get(token.message_id)
            if spot is not None:
                spot.append(token.text)
            await self._relay.add(token.message_id, token.text, token.logprobs or None)

    async def _on_pong(self, pong: Pong) -> None:
        was_healthy = self.backend_healthy
        self.backend_healthy = pong.backend_healthy
        if self.backend_healthy != was_healthy:
            logger.info("worker {} backend healthy: {}", self.session_id, self.backend_healthy)
        # What the worker sees beats our count: it may run fewer slots than declared, or share its
        # backend with other clients. Jobs assigned since it sent this pong are not in it yet.
        self.capacity.reported_free_slots = pong.free_slots - self._assigned.qsize() - self._claiming
        self.capacity.kv_cache_free_tokens = pong.kv_cache_free_tokens
        self.capacity.backend_queue_length = pong.backend_queue_length
        self._capacity_changed()
        if self.in_flight:
            # A claim not committed yet is invisible to the database: not counted as held. Batched
            # with the other workers' pongs (:mod:`.lease_extensions`): the receive loop reads on.
            holding = self.in_flight - self._gate.unconfirmed()
            self._lifecycle.leases.extend_soon(self.session_id, holding, self._cancel_again)
        await self._publish_session()

    async def _cancel_again(self, message_ids: list[str]) -> None:
        for message_id in message_ids:
            # Cancelled (or no longer ours) but not acknowledged with a result: the command may
            # have been lost or raced the claim; send it again until the worker answers.
            if message_id in self.in_flight:
                await self._send(Cancel(message_id=message_id))

    async def _on_error(self, error: WorkerError) -> None:
        metrics.ERRORS.labels("worker_retryable" if error.retryable else "worker_fatal").inc()
        if error.message_id is None:
            logger.warning("worker {} reported: {}", self.session_id, error.error)
            return
        if error.message_id in self._probes:
            self._finish_probe(
                error.message_id, ProbeOutcome(None, "", 0, f"the worker failed: {error.error}")
            )
            return
        if error.message_id not in self.in_flight:
            return
        await self._relay.flush()  # a retry or error event comes after the tokens it discards
        message_id = error.message_id
        self._done(message_id)
        if error.backend_unavailable or error.backend_died:
            # The backend had no room, was down or died: stop sending this worker work until a pong
            # says its backend is healthy again. A refused message goes back without spending its
            # attempt; one that was running when the backend died has the death counted against it.
            self.backend_healthy = False
            self._capacity_changed()
        await self._durably(
            lambda: self._lifecycle.release(
                message_id,
                self.session_id,
                error.error,
                retryable=error.retryable,
                backend_refused=error.backend_unavailable,
                backend_died=error.backend_died,
            ),
            f"releasing message {message_id}",
        )

    async def _check_usage(self, claimed: GeneratedText, counted: GeneratedText) -> None:
        """A worker that bills far more tokens than the server counted fails a compliance check (the
        usage stored is the server's bound in any case)."""
        excess = claimed.generated_tokens - counted.generated_tokens
        if self._compliance is None or excess <= self._settings.usage_overclaim_tokens:
            return
        await self._compliance.record(
            CheckResult(
                worker_id=self.worker_id,
                session_id=self.session_id,
                model_config_name=self.model_name,
                kind="usage",
                outcome=FAILED,
                detail=f"claimed {claimed.generated_tokens} generated tokens of message "
                f"{claimed.message_id}; the server counted at most {counted.generated_tokens}",
            )
        )

    # ------------------------------------------------------------ helpers
    def _within_token_cap(self, message_id: str) -> bool:
        """Count a token frame of a user job; False past the job's cap (logged once): it is dropped."""
        taken = self._token_frames.get(message_id, 0) + 1
        work = self._work.get(message_id)
        if work is not None and taken > token_cap(work):
            if taken == token_cap(work) + 1:
                logger.warning(
                    "worker {} sent more tokens for message {} than it may ({}): the rest are dropped",
                    self.session_id,
                    message_id,
                    token_cap(work),
                )
            self._token_frames[message_id] = taken
            return False
        self._token_frames[message_id] = taken
        return True

    def _done(self, message_id: str) -> None:
        if message_id in self.in_flight:
            metrics.IN_FLIGHT.labels(self.model_name).dec()
        self.in_flight.discard(message_id)
        self._dispatched_at.pop(message_id, None)
        self._first_token_at.pop(message_id, None)
        self._work.pop(message_id, None)
        self._streamed_bytes.pop(message_id, None)
        self._token_frames.pop(message_id, None)
        self._spot_tokens.pop(message_id, None)
        self._embeddings.pop(message_id, None)
        if self.capacity.reported_free_slots is not None:
            self.capacity.reported_free_slots += 1
        self._capacity_changed()

    def _count_token(self, message_id: str) -> None:
        self._tokens_relayed.inc()
        if message_id not in self._first_token_at:
            now = time.monotonic()
            self._first_token_at[message_id] = now
            dispatched = self._dispatched_at.get(message_id)
            if dispatched is not None:
                metrics.TIME_TO_FIRST_TOKEN.labels(self.model_name).observe(now - dispatched)

    def _observe_speed(self, message_id: str, generated_tokens: int) -> None:
        first = self._first_token_at.get(message_id)
        if first is not None and generated_tokens > 1:
            elapsed = time.monotonic() - first
            if elapsed > 0:
                metrics.TOKENS_PER_SECOND.labels(self.model_name).observe((generated_tokens - 1) / elapsed)
                self.capacity.observe_speed((generated_tokens - 1) / elapsed)

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
            raise _ConnectionClosed(CLOSE_POLICY_VIOLATION, "the worker does not read its socket") from None

    async def _publish_session(self) -> None:
        record = WorkerSession(
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
        ).record(self.session_id)
        try:
            await self._broker.put_worker_session(record, ttl=self._settings.worker_ping_timeout * 2)
        except BrokerError as exc:
            logger.warning("worker {}: session not published: {}", self.session_id, exc)

    async def _cleanup(self, close: _ConnectionClosed | None) -> None:
        self.calls.close()
        for message_id in list(self._probes):
            self._finish_probe(message_id, ProbeOutcome(None, "", 0, "the worker disconnected"))
        with contextlib.suppress(Exception):
            await self._dispatcher.detach(self)
        while not self._assigned.empty():  # assigned but never claimed: back to the queue
            with contextlib.suppress(Exception):
                await self._lifecycle.requeue(self._assigned.get_nowait()[0])
        reason = close.reason if close else "connection ended"
        metrics.WORKERS_CONNECTED.labels(self.model_name).dec()
        self._lifecycle.leases.forget(self.session_id)
        for message_id in list(self.in_flight):
            self._done(message_id)
            with contextlib.suppress(Exception):
                await self._lifecycle.release(message_id, self.session_id, f"worker lost: {reason}")
        with contextlib.suppress(Exception):
            await self._broker.remove_worker_session(self.session_id)
        if self.websocket.application_state == WebSocketState.CONNECTED:
            # Bounded: the close frame of a worker that does not read cannot go out either.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self._settings.worker_send_timeout):
                    await self.websocket.close(
                        code=close.code if close else CLOSE_GOING_AWAY, reason=reason[:120]
                    )
        logger.info("worker {} disconnected: {}", self.session_id, reason)
