"""The broker: everything the server keeps outside the database, behind one small interface.

Two implementations pass one contract test suite (``tests/broker``):

* :class:`~oasst_inference_server.broker.redis.RedisBroker` for production, shared by all replicas;
* :class:`~oasst_inference_server.broker.memory.InMemoryBroker` for the embedded default (one server
  process only).

The broker holds only what can be rebuilt from the database (rule 1 of docs/architecture.md, "the database is the truth"):

* **work queues**, one per model config: entries are *hints* naming a pending message; the claim itself
  is an atomic database update, so a duplicate or stale hint is harmless. A queue is *fair*: hints
  are grouped by user and popped in Virtual Token Counter order (:mod:`.fair`), so every replica
  serves the waiting user who has received the least (weighted) tokens first;
* **event streams**, one per message: an append-only log of the server-sent events of that message.
  Entry ids are strictly increasing strings and become the SSE event ids; any number of readers read a
  stream independently and resume after any id they saw. A stream expires ``stream_ttl`` seconds
  after its terminal event; the finished message is then served from the database;
* **worker sessions**, with a TTL refreshed while the worker answers pings;
* **commands** (e.g. cancel) published to the replica holding a worker's socket;
* **locks** with a TTL, so periodic jobs run on one replica at a time;
* **slots**: at most N holders of a name at once, each with a TTL (event-stream readers per user and
  per message, counted across replicas; a replica that dies leaves its slots to expire);
* **counters**: sliding-window and per-period totals that usage limits check and charge atomically
  (:mod:`.counters`).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import NamedTuple

from oasst_inference_server.broker.counters import CounterAdd, CounterCheck, CounterRefusal
from oasst_inference_server.broker.fair import QueueSnapshot, dispatch_order


class StreamEntry(NamedTuple):
    id: str
    data: str


class WorkerSessionRecord(NamedTuple):
    session_id: str
    model_config_name: str
    data: str  # JSON describing the session (capacity, in-flight work, ...)


class PoppedWork(NamedTuple):
    message_id: str
    job: str  # the note pushed with the hint ("" if none)


class BrokerError(RuntimeError):
    """The broker is unreachable or answered unexpectedly."""


class StreamsReader(abc.ABC):
    """One reader of many event streams at once: one broker read for all of them (the stream fan-out's
    reader, one per server process). Made by :meth:`Broker.streams_reader`; one read at a time."""

    @abc.abstractmethod
    async def read(
        self, after: Mapping[str, str | None], timeout: float, count: int = 512
    ) -> dict[str, list[StreamEntry]]:
        """For each stream of ``after`` that has entries with ids greater than its id there (all of
        them for None), those entries, oldest first, at most ``count`` per stream.

        Returns at once when any stream has some; otherwise waits up to ``timeout`` seconds for the
        first to come, or until :meth:`wake`, and then returns what there is (perhaps nothing).
        """

    @abc.abstractmethod
    def wake(self) -> None:
        """End the wait of the read under way (or, if none, of the next read): the streams to read
        have changed."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the reader holds (a connection)."""


class Broker(abc.ABC):
    # Bumped when this process puts a worker session it had not put before, or removes one: a view of
    # the sessions cached in this process (:mod:`.session_view`) is stale from then on. Sessions that
    # other replicas add or remove change no counter here; such a view re-reads them at a bounded age.
    local_session_changes: int = 0

    def session_changed_here(self) -> None:
        """A session this process holds changed what it serves (a model switch): the cached views of
        this process are stale, as after a new or a removed session."""
        self.local_session_changes += 1

    def lost_here(self, session_id: str) -> bool:
        """Whether the last read of all sessions (:mod:`.session_view`) missed this process's session
        ``session_id`` (Redis was flushed, or restarted empty) and it has not been put since: its
        connection writes it again at its next pong, whether or not it changed."""
        return session_id in self.__dict__.get("_lost_session_ids", ())

    def note_sessions_read(self, session_ids: Collection[str]) -> None:
        """The ids a read of all sessions found: this process's sessions among them are not lost."""
        ids: set[str] = self.__dict__.get("_local_session_ids", set())
        self.__dict__["_lost_session_ids"] = ids.difference(session_ids)

    def _note_local_session(self, session_id: str, present: bool) -> None:
        """Called by :meth:`put_worker_session` (present) and :meth:`remove_worker_session` (not)."""
        lost: set[str] | None = self.__dict__.get("_lost_session_ids")
        if lost:
            lost.discard(session_id)
        ids: set[str] = self.__dict__.setdefault("_local_session_ids", set())
        if (session_id in ids) != present:
            if present:
                ids.add(session_id)
            else:
                ids.discard(session_id)
            self.local_session_changes += 1

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open connections. Called once before use."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and wake blocked readers."""

    @abc.abstractmethod
    async def ping(self) -> bool:
        """True when the broker answers."""

    # ------------------------------------------------------------ work queues
    @abc.abstractmethod
    async def push_work(
        self, queue: str, message_id: str, *, user: str = "", cost: float = 1.0, job: str = ""
    ) -> None:
        """Add a hint that ``message_id`` of ``user`` waits in ``queue``.

        ``cost`` is what serving it adds to the user's counter: estimated tokens divided by the
        user's weight. Hints of one user pop in the order they were pushed. ``job`` is a short note
        that comes back with the hint from :meth:`pop_hint` (what the dispatcher needs to place the
        job without reading the message). Notes are kept per message: a later note replaces an
        earlier one, and the first pop of the message takes it (a duplicate hint brings back "").
        """

    @abc.abstractmethod
    async def pop_hint(self, queue: str, timeout: float) -> PoppedWork | None:
        """Take the next hint in fair order with its job note, waiting up to ``timeout`` seconds; None
        if none came."""

    async def pop_work(self, queue: str, timeout: float) -> str | None:
        """:meth:`pop_hint` without the note: the message id only."""
        popped = await self.pop_hint(queue, timeout)
        return None if popped is None else popped.message_id

    @abc.abstractmethod
    async def serve_now(self, queue: str, *, user: str, cost: float) -> bool:
        """If no hint waits in ``queue``, count a job of ``user`` as served at once (its counter moves
        as a push and its pop would move it) and return True: the job may go to a worker without
        queueing, jumping nobody. False, with nothing changed, while any hint waits."""

    @abc.abstractmethod
    async def charge(self, queue: str, user: str, amount: float) -> None:
        """Correct ``user``'s counter by ``amount`` (real tokens served minus the estimate, weighted)."""

    @abc.abstractmethod
    async def queue_length(self, queue: str) -> int:
        """How many hints ``queue`` holds."""

    @abc.abstractmethod
    async def queue_snapshot(self, queue: str) -> QueueSnapshot:
        """Counters and waiting hints of the backlogged users (one consistent read)."""

    async def queued_ids(self, queue: str) -> list[str]:
        """The hints in ``queue`` in the order they will be popped (if nothing changes meanwhile)."""
        return [hint.message_id for hint in dispatch_order(await self.queue_snapshot(queue))]

    @abc.abstractmethod
    async def remove_work(self, queue: str, message_id: str) -> None:
        """Drop every hint for ``message_id`` from ``queue`` (e.g. it was cancelled while pending)."""

    # ------------------------------------------------------------ event streams
    @abc.abstractmethod
    async def append_event(self, stream: str, data: str, *, terminal: bool = False) -> str:
        """Append ``data`` (one JSON-encoded event) and return its id.

        ``terminal`` marks the last event of the stream: the stream then expires after the broker's
        ``stream_ttl``.
        """

    async def append_events(self, entries: list[tuple[str, str]]) -> None:
        """Append non-terminal events, each ``(stream, data)``, in order.

        The batched form of :meth:`append_event` for the token relay (one round trip where the
        implementation can). On failure some of the entries may have been appended.
        """
        for stream, data in entries:
            await self.append_event(stream, data)

    @abc.abstractmethod
    async def read_events(
        self, stream: str, after: str | None, timeout: float, count: int = 512
    ) -> list[StreamEntry]:
        """Entries with ids greater than ``after`` (all of them when ``after`` is None), oldest first.

        Returns at once when there are any; otherwise waits up to ``timeout`` seconds for the next one
        and returns an empty list if none came. At most ``count`` entries per call.
        """

    @abc.abstractmethod
    def streams_reader(self) -> StreamsReader:
        """A reader of many streams in one read (:class:`StreamsReader`)."""

    @abc.abstractmethod
    async def first_kept_if_trimmed(self, stream: str) -> str | None:
        """If the stream dropped entries to keep its length limit, the id of its oldest kept entry
        (a reader resuming from an older id may have missed events); None if it dropped none."""

    @abc.abstractmethod
    async def stream_exists(self, stream: str) -> bool:
        """True while the stream holds any entry (it has not expired or been deleted)."""

    @abc.abstractmethod
    async def delete_stream(self, stream: str) -> None:
        """Forget a stream and its entries (used when a message is retried from scratch or deleted)."""

    # ------------------------------------------------------------ worker sessions
    @abc.abstractmethod
    async def put_worker_session(self, record: WorkerSessionRecord, ttl: float) -> None:
        """Create or refresh a worker session; it disappears ``ttl`` seconds after the last put."""

    @abc.abstractmethod
    async def remove_worker_session(self, session_id: str) -> None: ...

    @abc.abstractmethod
    async def list_worker_sessions(self) -> list[WorkerSessionRecord]:
        """Every live (unexpired) worker session, across all replicas."""

    # ------------------------------------------------------------ commands
    @abc.abstractmethod
    async def publish_command(self, channel: str, data: str) -> None:
        """Deliver ``data`` to every current subscriber of ``channel`` (at most once, not stored)."""

    @abc.abstractmethod
    def subscribe_commands(self, channel: str) -> AbstractAsyncContextManager[AsyncIterator[str]]:
        """``async with broker.subscribe_commands(ch) as commands: async for data in commands: ...``

        The subscription is active when the ``async with`` body starts.
        """

    # ------------------------------------------------------------ locks
    @abc.abstractmethod
    async def acquire_lock(self, name: str, owner: str, ttl: float) -> bool:
        """Take or extend the lock ``name`` for ``owner`` for ``ttl`` seconds; False if another holds it."""

    @abc.abstractmethod
    async def release_lock(self, name: str, owner: str) -> None:
        """Release the lock if ``owner`` holds it."""

    # ------------------------------------------------------------ slots
    async def acquire_slot(self, name: str, holder: str, limit: int, ttl: float) -> bool:
        """Take (or extend) one of ``limit`` slots of ``name`` for ``holder`` for ``ttl`` seconds; False
        when ``limit`` other unexpired holders have one. Extending a held slot always succeeds."""
        return await self.acquire_slots([(name, limit)], holder, ttl) is None

    @abc.abstractmethod
    async def acquire_slots(self, slots: Sequence[tuple[str, int]], holder: str, ttl: float) -> str | None:
        """As :meth:`acquire_slot` for every ``(name, limit)`` of ``slots`` at once (one round trip), all
        or none: None when ``holder`` has them all, else the name of a full one (and none is taken)."""

    async def release_slot(self, name: str, holder: str) -> None:
        """Give the slot back (nothing happens when ``holder`` has none)."""
        await self.release_slots([name], holder)

    @abc.abstractmethod
    async def release_slots(self, names: Sequence[str], holder: str) -> None:
        """As :meth:`release_slot` for each of ``names``, at once."""

    # ------------------------------------------------------------ counters
    @abc.abstractmethod
    async def check_counters(self, checks: Sequence[CounterCheck]) -> CounterRefusal | None:
        """If every check has room, add each one's ``need`` and return None; else change nothing and
        return the first without room (:mod:`.counters`). One atomic step across replicas."""

    @abc.abstractmethod
    async def add_counters(
        self, adds: Sequence[CounterAdd], *, once: str | None = None, once_ttl: int = 0
    ) -> bool:
        """Add each amount, unchecked; with ``once``, only if nothing was added under that name in the
        last ``once_ttl`` seconds (False then, with nothing added)."""

    @abc.abstractmethod
    async def read_counters(self, reads: Sequence[tuple[str, int]]) -> list[int]:
        """What each ``(name, window)`` counter holds now (0 for a missing one)."""

    @abc.abstractmethod
    async def seed_counter(self, name: str, value: int, ttl: int) -> bool:
        """Set the plain counter ``name`` to ``value`` unless it exists (rebuilt from the database after
        the broker lost it); False if it existed."""
