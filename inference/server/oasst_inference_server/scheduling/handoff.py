"""A new job handed to an idle worker of this process inside the transaction that creates it.

Queued, a job reaches its worker after the insert's commit (a disk flush), the push, the pop and the
claim. When nothing waits in the model's queue and a worker of this process has room for the job, none of
that orders anything: the submission claims the new message for that worker before it is even written
(``MessageLifecycle.claim_unsaved``: the claim's values set on the new row, the work frame built as any
claim builds it), sends the work, and only then commits the insert. Nobody else can know of the message
before that commit, so nothing needs locking; the worker has the job while the insert and its flush run,
and its connection holds back whatever it answers until the commit is confirmed (:mod:`.claim_gate`). A
commit that fails makes the job void, as for a claim whose commit failed, and the request fails as it
would have without a worker.

Fairness is kept: the fair queue counts the job as served at once (``Broker.serve_now``, which moves the
user's counter exactly as a push and its pop would) and refuses while any hint waits, so a job handed
over never jumps one that queues. The worker is chosen by :func:`.capacity.choose_worker` among the
workers of this process, as the dispatcher would choose, and only while the model's dispatcher waits on
an empty queue (nothing popped is being placed). In every other case, and whenever a step fails before
the send, the job is queued as usual.

May import scheduling, events, broker, db, settings; not dispatch, workers or anything above.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import NamedTuple, Protocol, cast

from loguru import logger
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server import events
from oasst_inference_server.broker import Broker, BrokerError
from oasst_inference_server.db.models import DbMessage
from oasst_inference_server.scheduling.dispatcher import Dispatchers
from oasst_inference_server.scheduling.fair_share import Ticket
from oasst_inference_server.settings import Settings


class TakesHandOvers(Protocol):
    """What a hand-over needs of a worker connection (``worker_connection.WorkerConnection``)."""

    session_id: str

    def unreserve(self) -> None: ...

    async def hand_over(
        self,
        session: AsyncSession,
        message: DbMessage,
        permit: Awaitable[bool],
        known: Sequence[DbMessage] = (),
    ) -> bool: ...

    async def handed(self, message_id: str, *, committed: bool) -> None: ...


class HandedOver(NamedTuple):
    """A job sent to ``connection`` before its transaction committed: report the commit's outcome."""

    connection: TakesHandOvers
    message_id: str

    async def committed(self, ok: bool) -> None:
        await self.connection.handed(self.message_id, committed=ok)


class Handoff:
    def __init__(self, dispatchers: Dispatchers, broker: Broker, settings: Settings) -> None:
        self._dispatchers = dispatchers
        self._broker = broker
        self._settings = settings

    async def try_hand_over(
        self, session: AsyncSession, message: DbMessage, ticket: Ticket, known: Sequence[DbMessage] = ()
    ) -> HandedOver | None:
        """Send ``message`` (added to ``session`` as pending, not yet committed) to an idle worker of
        this process now, claimed in ``session``'s transaction; None if it must queue instead (nothing
        of the attempt is left in the transaction or the fair queue then)."""
        model = message.model_config_name
        dispatcher = self._dispatchers.by_model.get(model) if model else None
        if dispatcher is None or model is None:
            return None
        reserved = dispatcher.take_now(ticket.placement())
        if reserved is None:
            return None
        connection = cast(TakesHandOvers, reserved)
        queue = events.work_queue_name(model)
        cost = ticket.estimated_cost(self._settings)
        # The fair queue's answer comes while the connection builds the frame (and reads the
        # conversation, where it must).
        permit = asyncio.ensure_future(self._serve_now(queue, ticket.user, cost, message.id))
        sent = False
        try:
            sent = await connection.hand_over(session, message, permit, known)
        finally:
            if not sent:
                await self._take_back(permit, queue, ticket.user, cost, message.id)
        return HandedOver(connection, message.id) if sent else None

    async def _serve_now(self, queue: str, user: str, cost: float, message_id: str) -> bool:
        try:
            return await self._broker.serve_now(queue, user=user, cost=cost)
        except BrokerError as exc:
            logger.warning("message {}: fair queue unreadable ({}): queued instead", message_id, exc)
            return False

    async def _take_back(
        self, permit: asyncio.Future[bool], queue: str, user: str, cost: float, message_id: str
    ) -> None:
        """The job queues after all: if the fair queue counted it served, the push will count it again,
        so that serving is taken back."""
        try:
            served = await asyncio.shield(permit)
        except Exception:
            return
        if served:
            try:
                await self._broker.charge(queue, user, -cost)
            except BrokerError as exc:
                logger.warning("fair-share refund of {} not applied: {}", message_id, exc)
