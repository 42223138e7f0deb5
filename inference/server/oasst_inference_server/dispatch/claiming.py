"""The claim steps of a message's life: a pending message taken for one worker session, its work frame
built, its leases extended. :class:`Claiming` is the base of :class:`.message_lifecycle.MessageLifecycle`,
which holds the rest of the state machine; both change the state only by one conditional update each.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import asynccontextmanager, suppress
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import update
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server import events
from oasst_inference_server.broker import Broker, BrokerError
from oasst_inference_server.db.models import DbMessage, utcnow
from oasst_inference_server.dispatch import lease_extensions
from oasst_inference_server.dispatch.claim import CLAIM_VALUES, Taken, conversation, take
from oasst_inference_server.dispatch.lease_extensions import LeaseExtensions, lease_interval
from oasst_inference_server.dispatch.work_frames import Claimed, UnsendableMessage, work_frame
from oasst_inference_server.settings import Settings
from oasst_shared.protocol import PROTOCOL_VERSION
from oasst_shared.schemas import MessageState


class Claiming:
    def __init__(
        self,
        session_factory: async_sessionmaker[AsyncSession],
        broker: Broker,
        settings: Settings,
        lease_sessions: async_sessionmaker[AsyncSession] | None = None,
    ):
        self._sessions = session_factory
        self._broker = broker
        self._settings = settings
        # Every pong of this process's workers extends their leases through it, batched (on
        # ``lease_sessions``, a pool of its own where main gives one).
        self.leases = LeaseExtensions(
            lease_sessions or session_factory,
            lease_seconds=settings.lease_seconds,
            interval=lease_interval(settings),
        )

    async def get(self, message_id: str) -> DbMessage | None:
        async with self._sessions() as session:
            return await session.get(DbMessage, message_id)

    async def claim(self, message_id: str, session_id: str, **options: Any) -> Claimed | None:
        """Atomically take a pending message for a worker session, committed; None if someone else has
        it. :meth:`open_claim` (with its keyword ``options``) with nothing done before the commit."""
        async with self.open_claim(message_id, session_id, **options) as claimed:
            return claimed

    @asynccontextmanager
    async def open_claim(
        self,
        message_id: str,
        session_id: str,
        *,
        max_input_tokens: int | None = None,
        max_new_tokens: int | None = None,
        protocol_version: int = PROTOCOL_VERSION,
        cut_chat_prompts: bool = False,
        continues_answers: bool = False,
    ) -> AsyncIterator[Claimed | None]:
        """Take a pending message for a worker session: the claim is made when the block starts (None:
        someone else has it) and committed when it ends, or rolled back if the block raises. Until the
        commit the message's row stays locked, so no other session can take it; the block may send the
        work meanwhile, provided nothing the worker answers is stored before the commit succeeded.

        One transaction: the conditional UPDATE returns the claimed row with the messages of its chat
        (one statement on Postgres, :mod:`.claim`). The conversation is cut to ``max_input_tokens`` (the
        worker's model's input budget) first. ``max_new_tokens`` (the message's, as its ticket says)
        lets the UPDATE set the generation deadline too; without it, or if the message asks for another
        number, a second UPDATE sets it. The frame is built for a worker speaking ``protocol_version``;
        ``cut_chat_prompts`` (its model config's ``chat_prompt_overflow``) has a chat answer's work ask
        the worker to cut a newest turn too long for the model. ``continues_answers``: the worker continues
        the start of an answer a lost worker streamed (:mod:`.continuation`); if it cannot, the answer
        starts over, with a ``retry`` event once the claim is committed.
        Raises :class:`UnsendableMessage` (the claim rolled back) for a message no frame can carry.
        """
        now = utcnow()
        values: dict[str, Any] = {
            "worker_session_id": session_id,
            "lease_deadline": now + timedelta(seconds=self._settings.lease_seconds),
            "started_at": now,
        }
        if max_new_tokens is not None:
            values["generation_deadline"] = self._generation_deadline(now, max_new_tokens)
        async with self._sessions() as session:
            taken = await take(session, message_id, values)
            if taken is None:
                await session.rollback()
                yield None
                return
            try:
                claimed = work_frame(
                    taken,
                    max_input_tokens,
                    protocol_version,
                    cut_chat_prompts=cut_chat_prompts,
                    continues=continues_answers,
                )
            except UnsendableMessage:
                await session.rollback()
                raise
            asked = claimed.work_units
            changes: dict[str, Any] = {"answer_prefix": None} if claimed.restarted else {}
            if asked != max_new_tokens:
                changes["generation_deadline"] = self._generation_deadline(now, asked)
            if changes:
                await session.exec(update(DbMessage).where(DbMessage.id == message_id).values(**changes))
            try:
                yield claimed
            except BaseException:
                await session.rollback()
                raise
            await session.commit()
        if claimed.restarted:
            reason = "the worker that took the message cannot continue its answer: it starts over"
            with suppress(BrokerError):  # readers then see the new text after the old, until the end
                await self._broker.append_event(
                    events.stream_name(message_id), events.retry_event(taken.message.attempts, reason)
                )

    async def claim_unsaved(
        self,
        session: AsyncSession,
        message: DbMessage,
        session_id: str,
        *,
        max_input_tokens: int | None = None,
        protocol_version: int = PROTOCOL_VERSION,
        known: Sequence[DbMessage] = (),
        cut_chat_prompts: bool = False,
    ) -> Claimed | None:
        """Claim ``message``, pending in ``session`` and not yet written, for a worker session: its claim's
        values are set on it (the caller's commit writes them with the insert) and its frame is built from
        its conversation as the transaction sees it. Nothing else can know of the message before that
        commit, so nothing needs locking. None, with ``message`` unchanged, if no frame can carry it.
        :meth:`unclaim_unsaved` undoes it before the commit. ``known``: messages of the chat the caller
        holds (the parent), which may spare the conversation's read (:func:`.claim.conversation`)."""
        chat = await conversation(session, message, known)
        now = utcnow()
        message.state = MessageState.in_progress
        message.attempts += 1
        message.worker_session_id = session_id
        message.lease_deadline = now + timedelta(seconds=self._settings.lease_seconds)
        message.started_at = now
        try:
            claimed = work_frame(
                Taken(message, chat), max_input_tokens, protocol_version, cut_chat_prompts=cut_chat_prompts
            )
        except UnsendableMessage:
            self.unclaim_unsaved(message)
            return None
        message.generation_deadline = self._generation_deadline(now, claimed.work_units)
        return claimed

    @staticmethod
    def unclaim_unsaved(message: DbMessage) -> None:
        message.state = MessageState.pending
        message.attempts -= 1
        for name in CLAIM_VALUES:
            setattr(message, name, None)

    def _generation_deadline(self, now: datetime, max_new_tokens: int) -> datetime:
        return now + timedelta(seconds=self._settings.in_progress_bound(max_new_tokens))

    async def extend_leases(self, session_id: str, holding: Collection[str] = ()) -> list[str]:
        """Extend the leases of one session's messages now; the messages its worker should stop
        (:func:`.lease_extensions.to_stop`). Connections extend theirs through :attr:`leases`, batched."""
        async with self._sessions() as session:
            owned = await lease_extensions.extend(session, [session_id], self._settings.lease_seconds)
            await session.commit()
        return lease_extensions.to_stop(owned[session_id], holding)
