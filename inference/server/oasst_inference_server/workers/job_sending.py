"""Sending a worker its jobs: the slots the dispatcher reserves on it, the claim of each job assigned to
it and its frame sent before the claim commits (``_dispatch``), and a job handed over inside the
transaction of the submission that creates it (:meth:`JobSending.hand_over`, :mod:`..scheduling.handoff`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Sequence

from loguru import logger
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server import metrics
from oasst_inference_server.db.models import DbMessage
from oasst_inference_server.dispatch.work_frames import UnsendableMessage
from oasst_inference_server.workers.connection_core import ConnectionClosed, ConnectionCore
from oasst_shared.protocol import CLOSE_GOING_AWAY, Cancel


class JobSending(ConnectionCore):
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
                closed = exc if isinstance(exc, ConnectionClosed) else None
                self._broken.set_result(closed or ConnectionClosed(CLOSE_GOING_AWAY, "socket closed"))
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

    async def _dispatch(self) -> None:
        while True:
            message_id, max_new_tokens = await self._assigned.get()
            if self.switch is not None or not self.loaded:
                # Told to switch since the job was assigned: it goes back to the queue.
                self._count_slot(-1)
                with contextlib.suppress(Exception):
                    await self._lifecycle.requeue(message_id)
                self._capacity_changed()
                continue
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
                    continues_answers=self.continues_answers,
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
            record = self._held.get(message_id)
            logger.info(
                "message {} -> worker {} (attempt {})",
                message_id,
                self.session_id,
                record.work.attempt if record is not None and record.work is not None else "?",
            )
            await self._publish_session()

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
