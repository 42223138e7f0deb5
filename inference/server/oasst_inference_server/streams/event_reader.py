"""Reading a message's events: the broker stream first, the database as the fallback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable

from loguru import logger

from oasst_inference_server import events
from oasst_inference_server.broker import Broker, BrokerError, StreamEntry
from oasst_inference_server.broker.keys import parse_stream_id
from oasst_inference_server.db.models import DbMessage, utcnow
from oasst_inference_server.settings import Settings
from oasst_inference_server.streams.fanout import StreamFanout, Subscription
from oasst_inference_server.streams.message_reads import MessageReads
from oasst_inference_server.streams.sse import SseEvent
from oasst_shared.schemas import MessageState

_TERMINAL_GRACE_SECONDS = 2.0
FIRST_PENDING_WAIT = 0.2  # seconds a new reader of a pending message waits for an event before its position
# The longest a reader of a silent message in progress waits between its state checks: the wait doubles
# from ``pending_update_interval`` while the message stays in progress with no event (a worker in a long
# prefill, held streams), and starts over at the next event.
MAX_SILENT_WAIT = 8.0


async def read_message_events(
    reads: MessageReads,
    fanout: StreamFanout,
    settings: Settings,
    message: DbMessage,
    after: str | None,
    is_disconnected: Callable[[], Awaitable[bool]],
) -> AsyncGenerator[list[SseEvent], None]:
    """The events of one message as batches of sse-starlette dicts (``id`` only for stored events).

    A batch is what one read returned (never empty), so a reader that fell behind catches up
    in one write to its client rather than one per token. Stored events come from the broker stream
    after ``after``, through this process's one reader of that stream (:mod:`.fanout`); while the
    message waits, a ``pending`` event with its queue position (its place in the fair queue's dispatch
    order) and estimated wait is added every ``pending_update_interval``, the first one as soon as a
    new reader has waited ``FIRST_PENDING_WAIT`` for its first event; while the message is in progress
    with no event, its state is checked after waits that double up to ``MAX_SILENT_WAIT``; it ends after
    exactly one terminal event, rebuilt from the database when the stream has expired. ``message`` is
    the message as the caller just read or created it.
    """
    message_id = message.id
    stream = events.stream_name(message_id)
    interval = settings.pending_update_interval
    wait = interval
    if message.state == MessageState.pending and after is None:
        # A message that gets a worker at once needs no queue position: working it out (the queue, the
        # workers, the database) would only compete with the claim on the way to the first token.
        wait = min(wait, FIRST_PENDING_WAIT)
    if after is not None and (gap := await _gap_event(fanout.broker, stream, after)) is not None:
        yield [{"data": gap}]
    async with fanout.subscribe(stream, after) as subscription:
        while True:
            try:
                entries = await subscription.read(timeout=wait)
            except BrokerError as exc:
                # Redis is down: keep the reader, follow the database until it is back.
                logger.warning("event stream of {} unavailable: {}", message_id, exc)
                await asyncio.sleep(interval)
                entries = []
            if entries:
                wait = interval
                batch, ended = _up_to_terminal(entries)
                yield batch
                if ended:
                    return
                continue
            if await is_disconnected():
                return
            # One read for every silent reader of this process at this moment (state_checks); the whole
            # message only where there is something to tell.
            state = await reads.state_checks.state(message_id)
            if state is None:
                return
            if state == MessageState.in_progress:
                # Nothing to tell until it moves: ask again later and later (one read per reader per
                # interval made 10,000 held streams the database's busiest client).
                wait = min(max(wait, interval) * 2, max(MAX_SILENT_WAIT, interval))
                continue
            wait = interval
            if state.is_terminal:
                # The database is updated just before the terminal event is appended: wait for the event
                # on the stream, so the reader gets it with its id and without reading the message. At a
                # burst of answers ending at once, thousands of readers see the new state together, and
                # a read of the whole message each (before this wait) emptied the request pool and cut
                # their streams mid-body.
                while late := await _read_quietly(subscription, _terminal_grace(message)):
                    batch, ended = _up_to_terminal(late)
                    yield batch
                    if ended:
                        return
                # No terminal event on the stream (expired, or Redis lost it): the database has the final
                # word (an ended message never moves again).
                message = await reads.get(message_id)
                if message is not None:
                    yield [{"data": reads.final_event(message)}]
                return
            if state == MessageState.pending:
                # Waiting: its place in the queue needs the whole message.
                message = await reads.get(message_id)
                if message is None:
                    return
                if MessageState(message.state) == MessageState.pending:
                    position = await reads.queue_position(message)
                    loading = await reads.model_loading(message)
                    yield [{"data": events.pending_event(*position, loading_model=loading)}]


def _terminal_grace(message: DbMessage) -> float:
    """How long a reader whose state check says its message has ended waits for the terminal event on the
    stream, before it rebuilds the event from the database.

    The state check gives the state alone, not when the message ended, and reading the message to know
    would be the very read this wait saves. The reader's own last read of it (the caller's, or a pending
    one's) tells enough: a message that had not ended then has ended while this reader followed it, at
    most a state check's wait ago, and its event is about to land (2 s); one that had ended over 30 s
    before has its event on the stream, read at once, or its stream has expired and nothing will land
    (0.01 s).
    """
    if not MessageState(message.state).is_terminal or message.finished_at is None:
        return _TERMINAL_GRACE_SECONDS
    recent = (utcnow() - message.finished_at).total_seconds() < 30
    return _TERMINAL_GRACE_SECONDS if recent else 0.01


async def _gap_event(broker: Broker, stream: str, after: str) -> str | None:
    """An explicit event when the stream trimmed entries a reader resuming after ``after`` has not
    seen: never a silent gap."""
    try:
        first_kept = await broker.first_kept_if_trimmed(stream)
    except BrokerError:
        return None
    try:
        if first_kept is None or parse_stream_id(after) >= parse_stream_id(first_kept):
            return None
    except ValueError:  # not an id of ours: read_events refuses it the usual way
        return None
    return events.gap_event(after, first_kept)


def _up_to_terminal(entries: list[StreamEntry]) -> tuple[list[SseEvent], bool]:
    """The entries as SSE dicts, cut after the first terminal one; and whether there was one."""
    batch: list[SseEvent] = []
    for entry in entries:
        batch.append({"id": entry.id, "data": entry.data})
        if events.is_terminal(entry.data):
            return batch, True
    return batch, False


async def _read_quietly(subscription: Subscription, timeout: float) -> list[StreamEntry]:
    try:
        return await subscription.read(timeout)
    except BrokerError:
        return []
