"""The in-process broker of the embedded default: plain asyncio, one server process only.

It follows the Redis broker's observable behaviour (the shared contract suite in ``tests/broker`` runs
against both), including stream ids in Redis format, so code and clients cannot tell them apart.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field

from oasst_inference_server.broker.base import (
    Broker,
    PoppedWork,
    StreamEntry,
    StreamsReader,
    WorkerSessionRecord,
)
from oasst_inference_server.broker.counters import CounterAdd, CounterCheck, CounterRefusal, MemoryCounters
from oasst_inference_server.broker.fair import FairQueue, QueuedHint, QueueSnapshot
from oasst_inference_server.broker.keys import StreamId, parse_stream_id


@dataclass(eq=False)
class _Stream:
    ids: list[StreamId] = field(default_factory=list)
    entries: list[StreamEntry] = field(default_factory=list)
    expires_at: float | None = None  # loop time
    expiry: asyncio.TimerHandle | None = None
    trimmed: bool = False
    ended: bool = False  # its terminal event came: expires_at is the terminal TTL's


@dataclass(eq=False)
class _Signal:
    """Wakes the readers blocked on one stream; replaced after every append so no wake-up is missed."""

    event: asyncio.Event = field(default_factory=asyncio.Event)
    waiters: int = 0


@dataclass(eq=False)
class _WorkQueue:
    items: FairQueue
    # Blocked poppers, oldest first; a push hands its item straight to the first one still waiting.
    waiters: deque[asyncio.Future[QueuedHint | None]] = field(default_factory=deque)
    jobs: dict[str, str] = field(default_factory=dict)  # message id -> the job note of its hint


_END = object()


class _Subscription:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[object] = asyncio.Queue()

    def __aiter__(self) -> _Subscription:
        return self

    async def __anext__(self) -> str:
        item = await self.queue.get()
        if item is _END:
            self.queue.put_nowait(_END)  # stay ended for any later __anext__
            raise StopAsyncIteration
        assert isinstance(item, str)
        return item


class InMemoryBroker(Broker):
    def __init__(
        self,
        *,
        stream_ttl: float = 600.0,
        stream_maxlen: int = 10000,
        stream_idle_ttl: float = 3600.0,
        fair_credit: float = 0.0,
    ) -> None:
        if stream_ttl <= 0:
            raise ValueError("stream_ttl must be positive")
        if stream_maxlen < 1:
            raise ValueError("stream_maxlen must be at least 1")
        self.stream_ttl = stream_ttl
        self.stream_maxlen = stream_maxlen
        self.stream_idle_ttl = stream_idle_ttl
        self.fair_credit = max(0.0, fair_credit)
        self._closed = False
        self._queues: dict[str, _WorkQueue] = {}
        self._streams: dict[str, _Stream] = {}
        self._signals: dict[str, _Signal] = {}
        # The events of the streams readers waiting on each stream (set by an append to it).
        self._listeners: dict[str, set[asyncio.Event]] = {}
        self._last_id = StreamId(0, 0)
        self._sessions: dict[str, tuple[WorkerSessionRecord, float]] = {}
        self._subscriptions: dict[str, set[_Subscription]] = {}
        self._locks: dict[str, tuple[str, float]] = {}
        self._slots: dict[str, dict[str, float]] = {}  # name -> holder -> monotonic expiry
        self._counters = MemoryCounters()

    # ------------------------------------------------------------ lifecycle
    async def close(self) -> None:
        self._closed = True
        for wq in self._queues.values():
            while wq.waiters:
                _resolve(wq.waiters.popleft(), None)
        for signal in self._signals.values():
            signal.event.set()
        for listeners in self._listeners.values():
            for listener in listeners:
                listener.set()
        for subscriptions in self._subscriptions.values():
            for subscription in subscriptions:
                subscription.queue.put_nowait(_END)
        for stream in self._streams.values():
            if stream.expiry is not None:
                stream.expiry.cancel()

    async def ping(self) -> bool:
        return not self._closed

    # ------------------------------------------------------------ work queues
    def _queue(self, queue: str) -> _WorkQueue:
        wq = self._queues.get(queue)
        if wq is None:
            wq = self._queues[queue] = _WorkQueue(FairQueue(credit=self.fair_credit))
        return wq

    async def push_work(
        self, queue: str, message_id: str, *, user: str = "", cost: float = 1.0, job: str = ""
    ) -> None:
        wq = self._queue(queue)
        wq.items.push(message_id, user, cost)
        if job:
            wq.jobs[message_id] = job
        self._hand_over(queue, wq)

    def _hand_over(self, queue: str, wq: _WorkQueue) -> None:
        while wq.waiters and wq.items.length:
            waiter = wq.waiters.popleft()
            if not waiter.done():
                waiter.set_result(wq.items.pop())

    async def pop_hint(self, queue: str, timeout: float) -> PoppedWork | None:
        wq = self._queue(queue)
        hint = wq.items.pop()
        if hint is not None:
            return PoppedWork(hint.message_id, wq.jobs.pop(hint.message_id, ""))
        if timeout <= 0 or self._closed:
            return None
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[QueuedHint | None] = loop.create_future()
        wq.waiters.append(waiter)
        # call_later rather than wait_for: wait_for may cancel a future that already received an item
        # (Python >= 3.12), which would lose that item.
        timer = loop.call_later(timeout, _resolve, waiter, None)
        try:
            handed_hint = await waiter
            if handed_hint is None:
                return None
            return PoppedWork(handed_hint.message_id, wq.jobs.pop(handed_hint.message_id, ""))
        except asyncio.CancelledError:
            handed = waiter.result() if waiter.done() and not waiter.cancelled() else None
            if handed is not None:
                # Our caller was cancelled after an item was handed over: give it back (its user was
                # charged for it; the next pop of that user takes it first).
                wq.items.unpop(handed)
                self._hand_over(queue, wq)
            raise
        finally:
            timer.cancel()
            if not waiter.done():
                waiter.cancel()
            if waiter in wq.waiters:
                wq.waiters.remove(waiter)

    async def serve_now(self, queue: str, *, user: str, cost: float) -> bool:
        return self._queue(queue).items.serve_now(user, cost)

    async def charge(self, queue: str, user: str, amount: float) -> None:
        self._queue(queue).items.charge(user, amount)

    async def queue_length(self, queue: str) -> int:
        wq = self._queues.get(queue)
        return wq.items.length if wq else 0

    async def queue_snapshot(self, queue: str) -> QueueSnapshot:
        return self._queue(queue).items.snapshot()

    async def remove_work(self, queue: str, message_id: str) -> None:
        wq = self._queues.get(queue)
        if wq is not None:
            wq.items.remove(message_id)
            wq.jobs.pop(message_id, None)

    # ------------------------------------------------------------ event streams
    def _next_id(self) -> StreamId:
        # Like Redis: wall-clock milliseconds, a sequence within one millisecond, never going backwards.
        # One counter for all streams keeps ids increasing even across delete_stream and re-creation.
        now_ms = time.time_ns() // 1_000_000
        last = self._last_id
        self._last_id = StreamId(now_ms, 0) if now_ms > last.ms else StreamId(last.ms, last.seq + 1)
        return self._last_id

    def _live_stream(self, name: str) -> _Stream | None:
        stream = self._streams.get(name)
        if stream is not None and stream.expires_at is not None:
            if asyncio.get_running_loop().time() >= stream.expires_at:
                self._drop_stream(name)
                return None
        return stream

    def _drop_stream(self, name: str) -> None:
        stream = self._streams.pop(name, None)
        if stream is not None and stream.expiry is not None:
            stream.expiry.cancel()

    def _expire(self, name: str, stream: _Stream) -> None:
        # The loop may run a timer a clock tick early (hence the slack), and a later terminal event
        # cancels this timer and starts another; an idle expiry pushed back by later events re-arms.
        if self._streams.get(name) is not stream:
            return
        loop = asyncio.get_running_loop()
        remaining = (stream.expires_at or 0.0) - loop.time()
        if not stream.ended and remaining > 0.05:
            stream.expiry = loop.call_later(remaining, self._expire, name, stream)
            return
        self._drop_stream(name)

    async def append_event(self, stream: str, data: str, *, terminal: bool = False) -> str:
        record = self._live_stream(stream)
        if record is None:
            record = self._streams[stream] = _Stream()
        entry_id = self._next_id()
        record.ids.append(entry_id)
        record.entries.append(StreamEntry(str(entry_id), data))
        excess = len(record.entries) - self.stream_maxlen
        if excess > 0:
            record.trimmed = True
            del record.ids[:excess]
            del record.entries[:excess]
        loop = asyncio.get_running_loop()
        if terminal:
            if record.expiry is not None:
                record.expiry.cancel()
            record.ended = True
            record.expires_at = loop.time() + self.stream_ttl
            # Lazy expiry alone would keep a finished stream nobody reads again in memory forever.
            record.expiry = loop.call_later(self.stream_ttl, self._expire, stream, record)
        elif not record.ended:
            # A stream whose terminal event never comes (its chat deleted mid-answer) still expires.
            record.expires_at = loop.time() + self.stream_idle_ttl
            if record.expiry is None:
                record.expiry = loop.call_later(self.stream_idle_ttl, self._expire, stream, record)
        signal = self._signals.get(stream)
        if signal is not None:
            signal.event.set()
            signal.event = asyncio.Event()
        for listener in self._listeners.get(stream, ()):
            listener.set()
        return str(entry_id)

    def _entries_after(self, name: str, after: StreamId | None, count: int) -> list[StreamEntry]:
        record = self._live_stream(name)
        if record is None:
            return []
        start = 0 if after is None else bisect.bisect_right(record.ids, after)
        return record.entries[start : start + count]

    async def read_events(
        self, stream: str, after: str | None, timeout: float, count: int = 512
    ) -> list[StreamEntry]:
        after_id = None if after is None else parse_stream_id(after)
        count = max(1, count)
        entries = self._entries_after(stream, after_id, count)
        if entries or timeout <= 0 or self._closed:
            return entries
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        signal = self._signals.setdefault(stream, _Signal())
        signal.waiters += 1
        try:
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0 or self._closed:
                    return []
                event = signal.event
                try:
                    await asyncio.wait_for(event.wait(), remaining)
                except asyncio.TimeoutError:
                    return []
                entries = self._entries_after(stream, after_id, count)
                if entries:
                    return entries
        finally:
            signal.waiters -= 1
            if signal.waiters == 0 and self._signals.get(stream) is signal:
                del self._signals[stream]

    def streams_reader(self) -> StreamsReader:
        return _MemoryStreamsReader(self)

    def _entries_of(self, after: Mapping[str, str | None], count: int) -> dict[str, list[StreamEntry]]:
        found: dict[str, list[StreamEntry]] = {}
        for stream, position in after.items():
            entries = self._entries_after(
                stream, None if position is None else parse_stream_id(position), count
            )
            if entries:
                found[stream] = entries
        return found

    async def first_kept_if_trimmed(self, stream: str) -> str | None:
        record = self._live_stream(stream)
        if record is None or not record.trimmed or not record.ids:
            return None
        return str(record.ids[0])

    async def stream_exists(self, stream: str) -> bool:
        record = self._live_stream(stream)
        return record is not None and bool(record.entries)

    async def delete_stream(self, stream: str) -> None:
        self._drop_stream(stream)

    # ------------------------------------------------------------ worker sessions
    async def put_worker_session(self, record: WorkerSessionRecord, ttl: float) -> None:
        self._sessions[record.session_id] = (record, time.monotonic() + ttl)
        self._note_local_session(record.session_id, True)

    async def remove_worker_session(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        self._note_local_session(session_id, False)

    async def list_worker_sessions(self) -> list[WorkerSessionRecord]:
        now = time.monotonic()
        expired = [sid for sid, (_, expires_at) in self._sessions.items() if expires_at <= now]
        for sid in expired:
            del self._sessions[sid]
        return [record for record, _ in self._sessions.values()]

    # ------------------------------------------------------------ commands
    async def publish_command(self, channel: str, data: str) -> None:
        for subscription in self._subscriptions.get(channel, ()):
            subscription.queue.put_nowait(data)

    def subscribe_commands(self, channel: str) -> AbstractAsyncContextManager[AsyncIterator[str]]:
        return self._subscribe(channel)

    @asynccontextmanager
    async def _subscribe(self, channel: str) -> AsyncIterator[AsyncIterator[str]]:
        subscription = _Subscription()
        if self._closed:
            subscription.queue.put_nowait(_END)
        self._subscriptions.setdefault(channel, set()).add(subscription)
        try:
            yield subscription
        finally:
            subscribers = self._subscriptions.get(channel)
            if subscribers is not None:
                subscribers.discard(subscription)
                if not subscribers:
                    del self._subscriptions[channel]

    # ------------------------------------------------------------ locks
    async def acquire_lock(self, name: str, owner: str, ttl: float) -> bool:
        now = time.monotonic()
        held = self._locks.get(name)
        if held is not None and held[0] != owner and held[1] > now:
            return False
        self._locks[name] = (owner, now + ttl)
        return True

    async def release_lock(self, name: str, owner: str) -> None:
        held = self._locks.get(name)
        if held is not None and held[0] == owner:
            del self._locks[name]

    # ------------------------------------------------------------ slots
    async def acquire_slots(self, slots: Sequence[tuple[str, int]], holder: str, ttl: float) -> str | None:
        now = time.monotonic()
        live = {name: {h: t for h, t in self._slots.get(name, {}).items() if t > now} for name, _ in slots}
        full = next(
            (name for name, limit in slots if holder not in live[name] and len(live[name]) >= limit), None
        )
        if full is None:
            for holders in live.values():
                holders[holder] = now + ttl
        for name, holders in live.items():
            if holders:
                self._slots[name] = holders
            else:
                self._slots.pop(name, None)  # expired: not kept for a name nobody holds
        return full

    async def release_slots(self, names: Sequence[str], holder: str) -> None:
        for name in names:
            holders = self._slots.get(name)
            if holders is not None:
                holders.pop(holder, None)
                if not holders:
                    del self._slots[name]

    # ------------------------------------------------------------ counters
    async def check_counters(self, checks: Sequence[CounterCheck]) -> CounterRefusal | None:
        return self._counters.check(checks)

    async def add_counters(
        self, adds: Sequence[CounterAdd], *, once: str | None = None, once_ttl: int = 0
    ) -> bool:
        return self._counters.add(adds, once, once_ttl)

    async def read_counters(self, reads: Sequence[tuple[str, int]]) -> list[int]:
        return self._counters.read(reads)

    async def seed_counter(self, name: str, value: int, ttl: int) -> bool:
        return self._counters.seed(name, value, ttl)


def _resolve(future: asyncio.Future[QueuedHint | None], value: QueuedHint | None) -> None:
    if not future.done():
        future.set_result(value)


class _MemoryStreamsReader(StreamsReader):
    def __init__(self, broker: InMemoryBroker) -> None:
        self._broker = broker
        self._woken = False
        self._waiting: asyncio.Event | None = None

    async def read(
        self, after: Mapping[str, str | None], timeout: float, count: int = 512
    ) -> dict[str, list[StreamEntry]]:
        broker = self._broker
        count = max(1, count)
        found = broker._entries_of(after, count)
        woken, self._woken = self._woken, False
        if found or timeout <= 0 or woken or broker._closed:
            return found
        event = self._waiting = asyncio.Event()
        for stream in after:
            broker._listeners.setdefault(stream, set()).add(event)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout)
        finally:
            self._waiting = None
            for stream in after:
                listeners = broker._listeners.get(stream)
                if listeners is not None:
                    listeners.discard(event)
                    if not listeners:
                        del broker._listeners[stream]
        return broker._entries_of(after, count)

    def wake(self) -> None:
        if self._waiting is not None:
            self._waiting.set()
        else:
            self._woken = True
