"""One connected worker: dispatch work to it, relay its tokens, watch its health.

Five tasks run per connection and the first to end ends them all:

* ``_receive``  - parses worker frames (:mod:`.frame_receiving`); a refused frame fails only the messages
  it names (a frame that names none closes the socket with 1008);
* the relay     - writes the tokens ``_receive`` hands it to the broker in batches (:mod:`.token_relay`);
* ``_dispatch`` - claims and sends the jobs its model's dispatcher (:mod:`..scheduling.dispatcher`) assigns
  it (:mod:`.job_sending`);
* ``_ping``     - pings; a worker silent past ``worker_ping_timeout`` is disconnected;
* ``_commands`` - forwards commands (cancel) that any replica published for this session, has the
  worker answer other replicas' questions (:mod:`.remote_questions`), and starts the model switches any
  replica asks for (protocol 6, :mod:`.model_switching`).

Each message the worker holds has one record (:mod:`.in_flight`), created at its claim and removed in
one place; compliance checks go through one interface (:mod:`.compliance_hooks`).

Faults stay as small as their cause: a message that cannot be sent or whose frames are refused fails
alone; a database or broker outage is waited out (each step is retried) and never closes the socket.
When the connection ends, every message it still held is released for a retry elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable

from loguru import logger
from pydantic import ValidationError
from starlette.websockets import WebSocketDisconnect, WebSocketState

from oasst_inference_server import events, metrics
from oasst_inference_server.broker import BrokerError
from oasst_inference_server.fleet.commands import SwitchCommand, SwitchReply, is_switch_command
from oasst_inference_server.workers.compliance_rules import ProbeOutcome
from oasst_inference_server.workers.compliance_store import FLAG_COMMAND
from oasst_inference_server.workers.connection_core import ConnectionClosed
from oasst_inference_server.workers.frame_receiving import FrameReceiving
from oasst_inference_server.workers.job_sending import JobSending
from oasst_inference_server.workers.model_switching import ModelSwitching
from oasst_inference_server.workers.remote_questions import answer_question, is_question
from oasst_shared.protocol import (
    CLOSE_GOING_AWAY,
    CLOSE_INTERNAL_ERROR,
    CLOSE_UNAUTHORIZED,
    Cancel,
    Ping,
    ProtocolError,
    Tokenize,
    Tokenized,
    Work,
    parse_server_frame,
)

# Published on a session's command channel to close that socket from any replica (key revoked).
DISCONNECT_COMMAND = '{"type":"disconnect"}'


class WorkerConnection(ModelSwitching, JobSending, FrameReceiving):
    async def tokenize(self, question: Tokenize, timeout: float) -> Tokenized:
        """Ask the worker's backend to tokenize; raises ``CallFailed`` without a usable answer."""
        answer = await self.calls.ask(question, timeout)
        assert isinstance(answer, Tokenized)  # ask() checks that the answer is of the question's kind
        return answer

    async def probe(self, work: Work, timeout: float) -> ProbeOutcome:
        """Send a compliance check's job and collect its answer; inconclusive on a timeout, an error of
        the worker or its backend, or a lost socket (an honest but slow worker is never blamed)."""
        done = self._compliance.open_probe(work)
        if self.capacity.reported_free_slots is not None:
            self.capacity.reported_free_slots -= 1
        self._capacity_changed()
        try:
            await self._send(work)
            return await asyncio.wait_for(asyncio.shield(done), timeout)
        except asyncio.TimeoutError:
            with contextlib.suppress(Exception):
                await self._send(Cancel(message_id=work.message_id))
            return ProbeOutcome(None, "", 0, f"no answer within {timeout:.0f}s")
        except (RuntimeError, WebSocketDisconnect) as exc:
            return ProbeOutcome(None, "", 0, f"could not send the job: {exc}")
        finally:
            self._compliance.close_probe(work.message_id)
            if self.capacity.reported_free_slots is not None:
                self.capacity.reported_free_slots += 1
            self._capacity_changed()

    async def flag(self, reason: str) -> None:
        """Its key failed compliance checks: no more user work; what it holds finishes normally."""
        if self.trust.flagged:
            return
        self.trust.flagged, self.trust.flag_reason = True, reason
        logger.warning("worker {} is flagged and gets no user work: {}", self.session_id, reason)
        self._capacity_changed()
        await self._publish_session()

    async def run(self) -> None:
        metrics.WORKERS_CONNECTED.labels(self.metric_model).inc()
        await self._publish_session()
        if self._dispatcher is not None:
            self._dispatcher.attach(self)
        logger.info(
            "worker {} connected: model {}{}, {} slots, backend {}{}",
            self.session_id,
            self.model_name,
            "" if self.loaded else " (not loaded)",
            self.info.max_parallel_requests,
            self.info.backend_kind,
            f", can load {len(self.servable)} models" if self.switchable else "",
        )
        tasks = [
            asyncio.create_task(self._guard(self._receive), name="receive"),
            asyncio.create_task(self._guard(self._dispatch), name="dispatch"),
            asyncio.create_task(self._guard(self._ping), name="ping"),
            asyncio.create_task(self._guard(self._commands), name="commands"),
            asyncio.create_task(self._guard(self._relay.run), name="relay"),
        ]
        broken: asyncio.Future[ConnectionClosed | None] = asyncio.get_running_loop().create_future()
        self._broken = broken
        watched: list[asyncio.Future[ConnectionClosed | None]] = [*tasks, broken]
        close: ConnectionClosed | None = None
        try:
            done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                result = task.result()
                if isinstance(result, ConnectionClosed):
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
    async def _guard(self, task: Callable[[], Awaitable[None]]) -> ConnectionClosed | None:
        try:
            await task()
        except ConnectionClosed as closed:
            return closed
        except WebSocketDisconnect as exc:
            return ConnectionClosed(exc.code, "worker disconnected")
        except BrokerError as exc:  # a RuntimeError too, but not a closed socket
            logger.opt(exception=exc).error("worker {}: broker error escaped a task", self.session_id)
            return ConnectionClosed(CLOSE_GOING_AWAY, "server error")
        except RuntimeError as exc:  # starlette: send/receive on a closed socket
            return ConnectionClosed(CLOSE_GOING_AWAY, f"socket closed: {exc}")
        except Exception as exc:  # a bug: end this connection (its messages are retried), not the server
            logger.opt(exception=exc).error("worker {}: task failed", self.session_id)
            return ConnectionClosed(CLOSE_INTERNAL_ERROR, "server error")
        return None

    async def _ping(self) -> None:
        while True:
            await asyncio.sleep(self._settings.worker_ping_interval)
            if self._waiting_for_storage:
                self._last_pong = time.monotonic()  # the server is the one stuck, not the worker
            silent_for = time.monotonic() - self._last_pong
            if silent_for > self._settings.worker_ping_timeout:
                logger.warning("worker {} did not answer pings for {:.0f}s", self.session_id, silent_for)
                raise ConnectionClosed(CLOSE_GOING_AWAY, "ping timeout")
            self._check_switch_deadline()
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
            self.commands_ready.set()
            async for data in commands:
                if data == DISCONNECT_COMMAND:
                    raise ConnectionClosed(CLOSE_UNAUTHORIZED, "the worker's API key was revoked or changed")
                if data == FLAG_COMMAND:
                    await self.flag("its key was flagged on another replica")
                    continue
                if is_question(data):  # another replica asks this worker to count: answered aside
                    task = asyncio.create_task(answer_question(self.calls, self._broker, data))
                    self._background.add(task)
                    task.add_done_callback(self._background.discard)
                    continue
                if is_switch_command(data):  # any replica asks this worker to load or unload
                    task = asyncio.create_task(self._answer_switch(data))
                    self._background.add(task)
                    task.add_done_callback(self._background.discard)
                    continue
                try:
                    frame = parse_server_frame(data)
                except ProtocolError:
                    logger.error("bad command for worker {}: {}", self.session_id, data[:200])
                    continue
                if isinstance(frame, Cancel) and frame.message_id in self._held:
                    await self._send(frame)

    async def _answer_switch(self, data: str) -> None:
        try:
            command = SwitchCommand.model_validate_json(data)
        except ValidationError as exc:
            logger.error(
                "bad switch command for worker {}: {}", self.session_id, exc.errors(include_url=False)[:1]
            )
            return
        try:
            reply = await self.begin_switch(command)
        except Exception as exc:  # a bug: the asker must still hear, and this connection go on
            logger.opt(exception=exc).error("worker {}: starting a switch failed", self.session_id)
            reply = SwitchReply(
                request_id=command.request_id, accepted=False, code="worker_gone", detail="server error"
            )
        try:
            await self._broker.publish_command(command.reply_to, reply.model_dump_json())
        except BrokerError as exc:
            logger.warning(
                "worker {}: the answer to {} was not published: {}", self.session_id, command.request_id, exc
            )

    async def _cleanup(self, close: ConnectionClosed | None) -> None:
        self.calls.close()
        self._compliance.disconnected()
        self._switch_ended("lost")
        if self._dispatcher is not None:
            with contextlib.suppress(Exception):
                await self._dispatcher.detach(self)
        while not self._assigned.empty():  # assigned but never claimed: back to the queue
            with contextlib.suppress(Exception):
                await self._lifecycle.requeue(self._assigned.get_nowait()[0])
        reason = close.reason if close else "connection ended"
        metrics.WORKERS_CONNECTED.labels(self.metric_model).dec()
        self._lifecycle.leases.forget(self.session_id)
        if self.in_flight:
            # Every token received is in the streams before a release reads them (continuation).
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self._settings.worker_send_timeout):
                    await self._relay.write_pending()
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
