"""Receiving a worker's frames: parse each (a refused frame fails only the messages it names; one that
names none closes the socket with 1008), hold back what the claim gate holds (:mod:`.claim_gate`), and
handle it: tokens to the relay, answers and errors to the message lifecycle, pongs to the capacity the
dispatcher ranks the worker by, a model switch's frames (protocol 6) to :mod:`.model_switching`. Compliance jobs and spot checks go through :mod:`.compliance_hooks`.
"""

from __future__ import annotations

import asyncio
import functools
import time

from loguru import logger
from starlette.websockets import WebSocketDisconnect

from oasst_inference_server import metrics
from oasst_inference_server.broker import BrokerError
from oasst_inference_server.workers.answer_moderation import AnswerModeration
from oasst_inference_server.workers.claim_gate import named_messages
from oasst_inference_server.workers.connection_core import ConnectionClosed
from oasst_inference_server.workers.embedding_parts import PartRefused
from oasst_inference_server.workers.in_flight import InFlight
from oasst_inference_server.workers.worker_frames import (
    ReceivedFrame,
    Salvaged,
    bounded_usage,
    parse_or_salvage,
    salvage,
    utf8_size,
)
from oasst_shared.protocol import (
    CLOSE_MESSAGE_TOO_BIG,
    CLOSE_POLICY_VIOLATION,
    CLOSE_UNSUPPORTED_DATA,
    MAX_FRAME_BYTES,
    Cancel,
    Detokenized,
    Drain,
    Embeddings,
    EmbeddingsPart,
    GeneratedText,
    ModelSwitch,
    Pong,
    Tokenized,
    WorkerError,
    WorkerInfo,
    frame_bytes,
)
from oasst_shared.token_frames import TokenFrame, TokenFrames


class FrameReceiving(AnswerModeration):
    async def _receive(self) -> None:
        while True:
            received = await self.websocket.receive()
            if received["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(received.get("code", 1000))
            text = received.get("text")
            if text is None:
                raise ConnectionClosed(CLOSE_UNSUPPORTED_DATA, "binary frames are not part of the protocol")
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
            raise ConnectionClosed(close_code, f"malformed frame: {error}"[:120])
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
        if message_id not in self._held:
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
        except (ConnectionClosed, WebSocketDisconnect, asyncio.CancelledError):
            raise
        except Exception as exc:
            if isinstance(exc, RuntimeError) and not isinstance(exc, BrokerError):
                raise  # starlette: the socket is closed
            logger.opt(exception=exc).error(
                "worker {}: handling a {} frame failed", self.session_id, type(frame).__name__
            )
            if isinstance(message_id, str) and message_id in self._held:
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
            await self._on_generated(frame)
        elif isinstance(frame, EmbeddingsPart):
            await self._on_embeddings_part(frame)
        elif isinstance(frame, Embeddings):
            await self._on_embeddings(frame)
        elif isinstance(frame, WorkerError):
            await self._on_error(frame)
        elif isinstance(frame, (Tokenized, Detokenized)):
            self.calls.answered(frame)
        elif isinstance(frame, Drain):
            logger.info("worker {} is draining ({} in flight)", self.session_id, len(self._held))
            self.draining = True
            self._capacity_changed()
            await self._publish_session()
        elif isinstance(frame, ModelSwitch):
            await self._on_model_switch(frame)
        elif isinstance(frame, WorkerInfo):  # after a switch the server asked for, else refused
            await self._on_worker_info(frame)

    # ------------------------------------------------------------ frame handlers
    async def _on_token(self, token: TokenFrame) -> None:
        if self._compliance.took_token(token):
            return
        record = self._held.get(token.message_id)
        if record is None or token.message_id in self._gate.void:
            return  # late, after a cancel or a lost lease, or of a void job: dropped
        if not record.take_token_frame(self.session_id):
            return
        self._tokens_relayed.inc()
        to_first_token = record.first_token()
        if to_first_token is not None:
            metrics.TIME_TO_FIRST_TOKEN.labels(self.model_name).observe(to_first_token)
        record.streamed_bytes += utf8_size(token.text)
        if record.spot_tokens is not None:
            record.spot_tokens.append(token.text)
        watch = self._watch(record) if self._moderation is not None else None
        if watch is not None:
            await self._moderated_token(record, watch, token.text, token.logprobs or None)
            return
        await self._relay.add(token.message_id, token.text, token.logprobs or None)

    async def _on_generated(self, frame: GeneratedText) -> None:
        if await self._compliance.took_answer(frame):
            return
        record = self._held.get(frame.message_id)
        if record is None:
            return
        result = bounded_usage(frame, record.work, record.streamed_bytes)
        self._observe_speed(record, result)
        await self._compliance.check_usage(frame, result)
        self._compliance.finished(self, record, frame)
        watch = self._watch(record) if self._moderation is not None else None
        if watch is not None and await self._moderated_end(record, watch, result):
            return
        await self._relay.flush()  # the terminal event comes after every token
        # A result says the worker is alive as a pong does. Its storing may wait (thousands of answers
        # ending at once queue for the answers' connections) and this loop reads the worker's next frame,
        # its pong too, only after it: without this, a worker whose results queued longer than its lease
        # lost the messages it was still finishing (24 of 10,000 at bench.many_streams' release).
        self._extend_leases()
        await self._durably(
            lambda: self._lifecycle.complete(self.session_id, result),
            f"storing message {frame.message_id}",
        )
        self._done(frame.message_id)

    async def _on_embeddings_part(self, frame: EmbeddingsPart) -> None:
        record = self._held.get(frame.message_id)
        assembly = record.embeddings if record is not None else None
        if assembly is not None and frame.message_id not in self._gate.void:
            try:
                assembly.add(frame)
            except PartRefused as exc:
                await self._fail_refused(frame.message_id, str(exc))

    async def _on_embeddings(self, frame: Embeddings) -> None:
        record = self._held.get(frame.message_id)
        if record is None:
            return
        assembly = record.embeddings
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

    async def _on_pong(self, pong: Pong) -> None:
        if self._backend_health(pong.backend_healthy):
            logger.info("worker {} backend healthy: {}", self.session_id, pong.backend_healthy)
        # What the worker sees beats our count: it may run fewer slots than declared, or share its
        # backend with other clients. Jobs assigned since it sent this pong are not in it yet.
        self.capacity.reported_free_slots = pong.free_slots - self._assigned.qsize() - self._claiming
        self.capacity.kv_cache_free_tokens = pong.kv_cache_free_tokens
        self.capacity.backend_queue_length = pong.backend_queue_length
        self._capacity_changed()
        self._extend_leases()
        await self._publish_session(if_changed=True)

    def _extend_leases(self) -> None:
        """The worker is alive: extend the leases of what it holds, batched with the other workers' asks
        (:mod:`..dispatch.lease_extensions`); the receive loop reads on. A claim not committed yet is
        invisible to the database: not counted as held."""
        if self._held:
            holding = set(self.in_flight) - self._gate.unconfirmed()
            self._lifecycle.leases.extend_soon(self.session_id, holding, self._cancel_again)

    async def _cancel_again(self, message_ids: list[str]) -> None:
        for message_id in message_ids:
            # Cancelled (or no longer ours) but not acknowledged with a result: the command may
            # have been lost or raced the claim; send it again until the worker answers.
            if message_id in self._held:
                await self._send(Cancel(message_id=message_id))

    async def _on_error(self, error: WorkerError) -> None:
        metrics.ERRORS.labels("worker_retryable" if error.retryable else "worker_fatal").inc()
        if error.message_id is None:
            logger.warning("worker {} reported: {}", self.session_id, error.error)
            return
        if self._compliance.took_error(error.message_id, error.error):
            return
        record = self._held.get(error.message_id)
        if record is None:
            return
        if record.moderation is not None and record.moderation.cut is not None:
            self._done(error.message_id)  # cut by moderation, already stored: its slot is free now
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
                request_refused=error.request_refused,
            ),
            f"releasing message {message_id}",
        )

    def _observe_speed(self, record: InFlight, result: GeneratedText) -> None:
        first, generated_tokens = record.first_token_at, result.generated_tokens
        if first is None:
            return
        if generated_tokens > 1:
            elapsed = time.monotonic() - first
            if elapsed > 0:
                metrics.TOKENS_PER_SECOND.labels(self.model_name).observe((generated_tokens - 1) / elapsed)
                self.capacity.observe_speed((generated_tokens - 1) / elapsed)
        # The prefill: the prompt tokens the backend had to read, up to the first token.
        read = (result.prompt_tokens or 0) - (result.cached_tokens or 0)
        to_first_token = first - record.dispatched_at
        if read > 0 and to_first_token > 0:
            self.capacity.observe_prefill(read / to_first_token)
