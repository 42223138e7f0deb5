"""The production broker on Redis (redis-py >= 5, asyncio), shared by every server replica.

Layout (every name under ``key_prefix``, see :mod:`.keys`):

* work queue: a fair queue (per-user lists, a sorted set of user counters) updated by Lua scripts
  (:mod:`.fair_lua`); a popper with nothing to pop registers as waiting and BLPOPs a list of its own,
  where the next push puts the hint it pops for it in fair order;
* event stream: a Redis Stream (XADD with ``MAXLEN ~``); Redis entry ids are the event ids; a terminal
  event sets a PEXPIRE of ``stream_ttl`` in the same transaction as its XADD;
* worker session: a string key with a PX TTL holding the record, plus a sorted set indexing the session
  ids by expiry so listing does not need SCAN;
* commands: PUBLISH / SUBSCRIBE, one pub/sub connection per subscription;
* lock: SET NX PX, with Lua compare-and-extend and compare-and-delete so only the owner touches it.

Redis must run with ``maxmemory-policy noeviction``: an evicted queue or stream is lost work.
Every Redis failure leaves this module as :class:`~.base.BrokerError`.
"""

from __future__ import annotations

import asyncio
import enum
import json
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Literal, TypeVar

from loguru import logger
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError

from oasst_inference_server.broker import counters_lua, fair_lua, redis_lua
from oasst_inference_server.broker.base import (
    Broker,
    BrokerError,
    PoppedWork,
    StreamEntry,
    StreamsReader,
    WorkerSessionRecord,
)
from oasst_inference_server.broker.counters import CounterAdd, CounterCheck, CounterRefusal
from oasst_inference_server.broker.fair import QueuedHint, QueueSnapshot
from oasst_inference_server.broker.keys import RedisKeys, parse_stream_id
from oasst_inference_server.broker.redis_replies import (
    DATA_FIELD,
    hand_entry,
    handed_work,
    ms,
    popped_work,
    stream_entries,
    translated,
    unparsed,
)
from oasst_inference_server.broker.redis_streams_reader import RedisStreamsReader
from oasst_inference_server.broker.redis_wire import (
    RespWire,
    WireClosed,
    WireReplyError,
    WireTimeout,
    redact_url,
    wire_for,
)

T = TypeVar("T")

# Index entries are only garbage-collected this long after their recorded expiry: the score comes from
# the clock of whichever replica wrote it, and the session key's own PX TTL (Redis' clock) is the truth.
_SESSION_INDEX_GRACE_MS = 60_000
_PUBSUB_POLL_SECONDS = 5.0
# A waiting popper stays registered this much longer than its BLPOP blocks (then it unregisters, taking
# a hint handed to it meanwhile); a hand entry nobody took (its popper vanished) expires after a minute.
_HAND_SLACK_MS = 1000
_HAND_KEEP_MS = 60_000
# How long a popper that gave up (cancelled, or its connection failed) tries to give back a hint.
_GIVE_BACK_SECONDS = 2.0


class _Closed(enum.Enum):
    TOKEN = 0


_CLOSED = _Closed.TOKEN


class RedisBroker(Broker):
    def __init__(
        self,
        url: str,
        *,
        key_prefix: str = "oasst:",
        stream_ttl: float = 600.0,
        stream_maxlen: int = 10000,
        max_connections: int = 512,
        stream_idle_ttl: float = 3600.0,
        pool_timeout: float = 10.0,
        socket_timeout: float = 30.0,
        socket_connect_timeout: float = 5.0,
        retries: int = 3,
        client_name: str | None = "oasst-broker",
        fair_credit: float = 0.0,
    ) -> None:
        if stream_ttl <= 0:
            raise ValueError("stream_ttl must be positive")
        if stream_maxlen < 1:
            raise ValueError("stream_maxlen must be at least 1")
        if socket_timeout <= 0:
            raise ValueError("socket_timeout must be positive")
        self.url = url
        self.keys = RedisKeys(key_prefix)
        self.stream_ttl = stream_ttl
        self.stream_maxlen = stream_maxlen
        self.stream_idle_ttl = stream_idle_ttl
        self.fair_credit = max(0.0, fair_credit)
        # A blocking command must answer before the socket timeout fires, so long waits are split into
        # several blocking calls of at most this length.
        self._max_block = max(0.05, socket_timeout - min(5.0, socket_timeout / 2))
        # Blocked BLPOP / XREAD calls each hold a connection; the pool is sized for that, and a caller
        # that still finds it exhausted waits up to pool_timeout instead of failing at once.
        self._pool: BlockingConnectionPool = BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=pool_timeout,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_connect_timeout,
            decode_responses=True,
            client_name=client_name,  # tells our connections apart in CLIENT LIST
            # The parsing below is written against RESP2 replies (redis-py >= 8 defaults to RESP3).
            protocol=2,
            # Connection errors only: a command that timed out may have run, and re-sending an XADD
            # would duplicate an event.
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), retries, (RedisConnectionError,)),
        )
        # Typed Any on purpose: the typeshed stubs (types-redis 4.6) shadow redis-py's own annotations
        # and lack its 5.x API (aclose, ...), so checking calls against them would only mislead.
        self._client: Any = Redis(connection_pool=self._pool)
        # XREAD replies are read by stream_entries as they come: redis-py's own parsing builds a dict
        # of the fields of every entry, so of every token a reader relays.
        self._client.set_response_callback("XREAD", unparsed)
        self._acquire_lock = self._client.register_script(redis_lua.ACQUIRE_LOCK)
        self._release_lock = self._client.register_script(redis_lua.RELEASE_LOCK)
        self._delete_stream = self._client.register_script(redis_lua.DELETE_STREAM)
        self._append_events = self._client.register_script(redis_lua.APPEND_EVENTS)
        self._acquire_slots = self._client.register_script(redis_lua.ACQUIRE_SLOTS)
        self._fair_push = self._client.register_script(fair_lua.PUSH)
        self._fair_pop = self._client.register_script(fair_lua.POP)
        self._fair_wait = self._client.register_script(fair_lua.WAIT)
        self._fair_stop_waiting = self._client.register_script(fair_lua.STOP_WAITING)
        self._fair_remove = self._client.register_script(fair_lua.REMOVE)
        self._fair_charge = self._client.register_script(fair_lua.CHARGE)
        self._fair_serve_now = self._client.register_script(fair_lua.SERVE_NOW)
        self._fair_snapshot = self._client.register_script(fair_lua.SNAPSHOT)
        self._check_counters = self._client.register_script(counters_lua.CHECK)
        self._add_counters = self._client.register_script(counters_lua.ADD)
        self._read_counters = self._client.register_script(counters_lua.READ)
        # The per-token commands (the relay's append, the streams reader's XREAD) bypass redis-py on a
        # plain redis:// URL (:mod:`.redis_wire`); every other command, and any fallback, uses it.
        self._socket_timeout = socket_timeout
        self._socket_connect_timeout = socket_connect_timeout
        self._client_name = client_name
        self._wires: list[RespWire] = []  # closed with the broker (one per process and reader)
        self._wire = self.new_wire()
        self._closed = False
        self._closed_future: asyncio.Future[None] | None = None
        self._blocking: set[asyncio.Task[Any]] = set()

    def __repr__(self) -> str:
        return f"RedisBroker({redact_url(self.url)!r}, key_prefix={self.keys.prefix!r})"

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        with translated("PING"):
            await self._client.ping()
        logger.info("Redis broker connected to {} (prefix {!r})", redact_url(self.url), self.keys.prefix)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._closed_future is not None and not self._closed_future.done():
            self._closed_future.set_result(None)
        for wire in self._wires:
            await wire.close()
        blocking = list(self._blocking)
        for task in blocking:
            task.cancel()
        # Cancelled redis-py calls drop their connections; let them finish before closing the pool.
        await asyncio.gather(*blocking, return_exceptions=True)
        try:
            await self._client.aclose()
            await self._pool.disconnect()
        except (RedisError, OSError) as exc:
            logger.warning("closing the Redis broker: {}", exc)

    async def ping(self) -> bool:
        try:
            return bool(await asyncio.wait_for(self._client.ping(), 5.0))
        except (RedisError, OSError, asyncio.TimeoutError):
            return False

    async def _unless_closed(self, call: Coroutine[Any, Any, T]) -> T | Literal[_Closed.TOKEN]:
        """Run a blocking call, abandoning it (result ``_CLOSED``) when the broker closes meanwhile."""
        if self._closed:
            call.close()
            return _CLOSED
        if self._closed_future is None:
            self._closed_future = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(call)
        self._blocking.add(task)
        try:
            await asyncio.wait((task, self._closed_future), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()
            raise
        finally:
            self._blocking.discard(task)
        if task.done() and not task.cancelled():
            return task.result()
        task.cancel()  # only close() cancels these, so a cancelled call means "closed" as well
        return _CLOSED

    def _block_steps(self, timeout: float) -> Iterator[float]:
        """The block times of successive blocking calls that together wait ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            yield min(remaining, self._max_block)

    # ------------------------------------------------------------ work queues
    async def push_work(
        self, queue: str, message_id: str, *, user: str = "", cost: float = 1.0, job: str = ""
    ) -> None:
        with translated("push work"):
            await self._fair_push(
                keys=[self.keys.queue(queue)],
                args=[message_id, user, repr(float(cost)), repr(self.fair_credit), job, _HAND_KEEP_MS],
            )

    async def pop_hint(self, queue: str, timeout: float) -> PoppedWork | None:
        base = self.keys.queue(queue)
        with translated("pop work"):
            if timeout <= 0 or self._closed:
                return popped_work(await self._fair_pop(keys=[base], args=["1"]))
            # Lua cannot block: the popper registers as waiting and BLPOPs a list of its own, where the
            # next push puts the hint it popped for it (fair_lua: the wake-up and the pop in one step).
            popper = uuid.uuid4().hex
            hand = f"{base}hand:{popper}"
            for block in self._block_steps(timeout):
                registered_ms = ms(block) + _HAND_SLACK_MS
                popped = await self._fair_wait(keys=[base], args=[popper, registered_ms])
                if popped is not None:
                    return popped_work(popped)
                try:
                    reply = await self._unless_closed(self._client.blpop([hand], ms(block) / 1000))
                except (asyncio.CancelledError, RedisError, OSError):
                    # A hint handed over meanwhile must not go with this popper (best effort: if Redis
                    # itself is gone, the registration expires and the recovery loop re-queues).
                    await asyncio.shield(self._give_back(queue, base, popper))
                    raise
                if reply is _CLOSED:
                    return None  # closing: a hint handed meanwhile is re-queued by the recovery loop
                if reply is not None:
                    return handed_work(reply[1])
                handed = await self._fair_stop_waiting(keys=[base], args=[popper])
                if handed is not None:
                    return handed_work(handed)
        return None

    async def _give_back(self, queue: str, base: str, popper: str) -> None:
        """Unregister a popper whose caller gave up; push back a hint handed to it (at its user's tail;
        the counter gets its cost back)."""
        try:
            async with asyncio.timeout(_GIVE_BACK_SECONDS):
                handed = await self._fair_stop_waiting(keys=[base], args=[popper])
                if handed is None:
                    return
                work, cost, user = hand_entry(handed)
                await self._fair_charge(keys=[base], args=[user, repr(-cost)])
                await self.push_work(queue, work.message_id, user=user, cost=cost, job=work.job)
        except (RedisError, OSError, BrokerError, TimeoutError) as exc:
            logger.warning("a hint handed to a popper that gave up was not given back: {!r}", exc)

    async def serve_now(self, queue: str, *, user: str, cost: float) -> bool:
        with translated("serve now"):
            served = await self._fair_serve_now(
                keys=[self.keys.queue(queue)], args=[user, repr(float(cost)), repr(self.fair_credit)]
            )
        return bool(served)

    async def charge(self, queue: str, user: str, amount: float) -> None:
        with translated("charge"):
            await self._fair_charge(keys=[self.keys.queue(queue)], args=[user, repr(float(amount))])

    async def queue_length(self, queue: str) -> int:
        with translated("GET len"):
            return max(0, int(await self._client.get(self.keys.queue(queue) + "len") or 0))

    async def queue_snapshot(self, queue: str) -> QueueSnapshot:
        with translated("queue snapshot"):
            reply = await self._fair_snapshot(keys=[self.keys.queue(queue)])
        counters: dict[str, float] = {}
        waiting: dict[str, list[QueuedHint]] = {}
        for user, counter, flat in reply[1:]:
            counters[str(user)] = float(counter)
            waiting[str(user)] = [
                QueuedHint(str(flat[i]), str(user), float(flat[i + 1])) for i in range(0, len(flat), 2)
            ]
        return QueueSnapshot(float(reply[0]), counters, waiting)

    async def remove_work(self, queue: str, message_id: str) -> None:
        with translated("remove work"):
            await self._fair_remove(keys=[self.keys.queue(queue)], args=[message_id])

    # ------------------------------------------------------------ event streams
    async def append_event(self, stream: str, data: str, *, terminal: bool = False) -> str:
        key = self.keys.stream(stream)
        fields: dict[Any, Any] = {DATA_FIELD: data}
        with translated("XADD"):
            if not terminal:
                async with self._client.pipeline(transaction=True) as pipe:
                    pipe.xadd(key, fields, maxlen=self.stream_maxlen, approximate=True)
                    pipe.pexpire(key, ms(self.stream_idle_ttl))  # expires even if never ended
                    entry_id, _ = await pipe.execute()
                return str(entry_id)
            # One transaction, so a terminal event can never be left without its expiry.
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.xadd(key, fields, maxlen=self.stream_maxlen, approximate=True)
                pipe.pexpire(key, ms(self.stream_ttl))
                entry_id, _ = await pipe.execute()
            return str(entry_id)

    async def append_events(self, entries: list[tuple[str, str]]) -> None:
        if not entries:
            return
        per_stream: dict[str, list[str]] = {}
        for stream, data in entries:  # each stream's events keep their order
            per_stream.setdefault(stream, []).append(data)
        args: list[str | int] = [self.stream_maxlen, ms(self.stream_idle_ttl)]
        for datas in per_stream.values():
            args.append(len(datas))
            args.extend(datas)
        keys = [self.keys.stream(s) for s in per_stream]
        # One script call instead of one XADD each: one command to encode and one reply to parse, which
        # is most of what a token costs the server (a pipeline still parses a reply per XADD).
        wire = self._wire
        if wire is not None and not self._closed:
            try:
                await wire.call("EVALSHA", self._append_events.sha, len(keys), *keys, *args)
                return
            except WireReplyError as exc:
                if not str(exc).startswith("NOSCRIPT"):
                    raise BrokerError(f"redis XADD batch failed: {exc}") from exc
            except WireTimeout as exc:
                # It may have run: never sent again (redis-py does not retry a timeout either).
                raise BrokerError(f"redis XADD batch failed: {exc}") from exc
            except WireClosed as exc:
                # Not sent, or lost before its answer: redis-py sends it again (loading the script
                # first if Redis lost it), with its retries, as every append was before.
                logger.debug("redis append on the bare connection failed ({}): through redis-py", exc)
        with translated("XADD batch"):
            await self._append_events(keys=keys, args=args)

    async def read_events(
        self, stream: str, after: str | None, timeout: float, count: int = 512
    ) -> list[StreamEntry]:
        key = self.keys.stream(stream)
        # XREAD is exclusive of the id it is given and, with BLOCK, still answers at once when newer
        # entries exist: one call covers both "return what is there" and "wait for the next one".
        start = "0-0" if after is None else str(parse_stream_id(after))
        count = max(1, count)
        with translated("XREAD"):
            if timeout <= 0 or self._closed:
                return stream_entries(await self._client.xread({key: start}, count=count))
            for block in self._block_steps(timeout):
                reply = await self._unless_closed(
                    self._client.xread({key: start}, count=count, block=ms(block))
                )
                if reply is _CLOSED:
                    return []
                entries = stream_entries(reply)
                if entries:
                    return entries
        return []

    def new_wire(self) -> RespWire | None:
        """A bare connection for a per-token command (:mod:`.redis_wire`), None for a URL it does not speak."""
        wire = wire_for(
            self.url,
            timeout=self._socket_timeout,
            connect_timeout=self._socket_connect_timeout,
            client_name=self._client_name,
        )
        if wire is not None:
            self._wires.append(wire)
        return wire

    def streams_reader(self) -> StreamsReader:
        return RedisStreamsReader(self)

    async def first_kept_if_trimmed(self, stream: str) -> str | None:
        with translated("XINFO STREAM"):
            try:
                info = await self._client.xinfo_stream(self.keys.stream(stream))
            except ResponseError:  # no such stream
                return None
        # Redis 7 counts every entry ever added: more than it holds means some were trimmed.
        added, length, first = info.get("entries-added"), info.get("length"), info.get("first-entry")
        if added is None or length is None or not first or int(added) <= int(length):
            return None
        first_id = first[0]
        return first_id.decode() if isinstance(first_id, bytes) else str(first_id)

    async def stream_exists(self, stream: str) -> bool:
        with translated("EXISTS"):
            return bool(await self._client.exists(self.keys.stream(stream)))

    async def delete_stream(self, stream: str) -> None:
        with translated("DEL stream"):
            lead_ms = int(await self._delete_stream(keys=[self.keys.stream(stream)]))
        if lead_ms >= 0:
            # A re-created stream takes its ids from Redis' clock: returning only once that clock is past
            # the old last id keeps the new ids above any Last-Event-ID a client kept from the old stream.
            await asyncio.sleep(min(lead_ms + 1, 1000) / 1000)

    # ------------------------------------------------------------ worker sessions
    async def put_worker_session(self, record: WorkerSessionRecord, ttl: float) -> None:
        ttl_ms = ms(ttl)
        value = json.dumps({"model_config_name": record.model_config_name, "data": record.data})
        expires_at_ms = int(time.time() * 1000) + ttl_ms
        with translated("SET session"):
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.set(self.keys.session(record.session_id), value, px=ttl_ms)
                pipe.zadd(self.keys.session_index, {record.session_id: expires_at_ms})
                await pipe.execute()
        self._note_local_session(record.session_id, True)  # once written: a view read now sees it

    async def remove_worker_session(self, session_id: str) -> None:
        try:
            with translated("DEL session"):
                async with self._client.pipeline(transaction=True) as pipe:
                    pipe.delete(self.keys.session(session_id))
                    pipe.zrem(self.keys.session_index, session_id)
                    await pipe.execute()
        finally:
            self._note_local_session(session_id, False)

    async def list_worker_sessions(self) -> list[WorkerSessionRecord]:
        horizon_ms = int(time.time() * 1000) - _SESSION_INDEX_GRACE_MS
        with translated("list sessions"):
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.zremrangebyscore(self.keys.session_index, "-inf", horizon_ms)
                pipe.zrange(self.keys.session_index, 0, -1)
                _, session_ids = await pipe.execute()
            if not session_ids:
                return []
            values = await self._client.mget([self.keys.session(sid) for sid in session_ids])
        records = []
        for session_id, value in zip(session_ids, values, strict=True):
            if value is None:  # expired or removed; its index entry is pruned once past the grace
                continue
            try:
                payload = json.loads(value)
                records.append(WorkerSessionRecord(session_id, payload["model_config_name"], payload["data"]))
            except (ValueError, KeyError, TypeError):
                logger.warning("skipping malformed worker session record {!r}", session_id)
        return records

    # ------------------------------------------------------------ commands
    async def publish_command(self, channel: str, data: str) -> None:
        with translated("PUBLISH"):
            await self._client.publish(self.keys.channel(channel), data)

    def subscribe_commands(self, channel: str) -> AbstractAsyncContextManager[AsyncIterator[str]]:
        return self._subscribe(channel)

    @asynccontextmanager
    async def _subscribe(self, channel: str) -> AsyncIterator[AsyncIterator[str]]:
        name = self.keys.channel(channel)
        pubsub = self._client.pubsub()
        try:
            with translated("SUBSCRIBE"):
                await pubsub.subscribe(name)
                await self._confirm_subscription(pubsub, name)
            yield _Commands(self, pubsub)
        finally:
            # Closing drops the connection, which ends the subscription server-side; an UNSUBSCRIBE on
            # a connection that may hold a half-read reply (after a cancellation) would not be safe.
            try:
                await pubsub.aclose()
            except (RedisError, OSError) as exc:
                logger.debug("closing a pub/sub connection: {}", exc)

    async def _confirm_subscription(self, pubsub: Any, name: str) -> None:
        # SUBSCRIBE only sends the command: publishes that reach Redis before it processed it would be
        # missed, so wait for its confirmation before the caller relies on the subscription.
        deadline = time.monotonic() + self._max_block
        while (remaining := deadline - time.monotonic()) > 0:
            message = await pubsub.get_message(timeout=remaining)
            if message and message.get("type") == "subscribe" and message.get("channel") == name:
                return
        raise BrokerError(f"redis did not confirm the subscription to {name!r}")

    # ------------------------------------------------------------ locks
    async def acquire_lock(self, name: str, owner: str, ttl: float) -> bool:
        with translated("lock acquire"):
            return bool(await self._acquire_lock(keys=[self.keys.lock(name)], args=[owner, ms(ttl)]))

    async def release_lock(self, name: str, owner: str) -> None:
        with translated("lock release"):
            await self._release_lock(keys=[self.keys.lock(name)], args=[owner])

    # ------------------------------------------------------------ slots
    async def acquire_slots(self, slots: Sequence[tuple[str, int]], holder: str, ttl: float) -> str | None:
        keys = [self.keys.slots(name) for name, _ in slots]
        with translated("slot acquire"):
            full = await self._acquire_slots(
                keys=keys, args=[holder, ms(ttl), *(limit for _, limit in slots)]
            )
        return slots[int(full) - 1][0] if full else None

    async def release_slots(self, names: Sequence[str], holder: str) -> None:
        with translated("slot release"):
            async with self._client.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.zrem(self.keys.slots(name), holder)
                await pipe.execute()

    # ------------------------------------------------------------ counters
    async def check_counters(self, checks: Sequence[CounterCheck]) -> CounterRefusal | None:
        if not checks:
            return None
        args = [v for c in checks for v in (c.limit, c.need, c.window, max(1, c.ttl), int(c.seeded))]
        with translated("counter check"):
            index, used, retry = await self._check_counters(
                keys=[self.keys.counter(c.name) for c in checks], args=args
            )
        if not int(index):
            return None
        if int(retry) == -2:
            return CounterRefusal(int(index) - 1, 0, None, missing=True)
        return CounterRefusal(int(index) - 1, int(used), None if int(retry) < 0 else int(retry))

    async def add_counters(
        self, adds: Sequence[CounterAdd], *, once: str | None = None, once_ttl: int = 0
    ) -> bool:
        keys = [self.keys.counter(f"once:{once or ''}"), *(self.keys.counter(a.name) for a in adds)]
        args = [
            1 if once is not None else 0,
            max(1, once_ttl),
            *(v for a in adds for v in (a.amount, a.window, max(1, a.ttl), int(a.existing_only))),
        ]
        with translated("counter add"):
            return bool(await self._add_counters(keys=keys, args=args))

    async def read_counters(self, reads: Sequence[tuple[str, int]]) -> list[int]:
        if not reads:
            return []
        with translated("counter read"):
            values = await self._read_counters(
                keys=[self.keys.counter(name) for name, _ in reads], args=[w for _, w in reads]
            )
        return [int(v) for v in values]

    async def seed_counter(self, name: str, value: int, ttl: int) -> bool:
        with translated("counter seed"):
            return bool(await self._client.set(self.keys.counter(name), value, nx=True, ex=max(1, ttl)))


class _Commands:
    """The iterator of one subscription; it ends when the broker closes."""

    def __init__(self, broker: RedisBroker, pubsub: Any) -> None:
        self._broker = broker
        self._pubsub = pubsub

    def __aiter__(self) -> _Commands:
        return self

    async def __anext__(self) -> str:
        with translated("pub/sub read"):
            while True:
                # Short polls rather than one endless read: redis-py's "block forever" differs between
                # versions, and a poll notices a dead connection (redis-py reconnects and resubscribes).
                message = await self._broker._unless_closed(
                    self._pubsub.get_message(ignore_subscribe_messages=True, timeout=_PUBSUB_POLL_SECONDS)
                )
                if message is _CLOSED:
                    raise StopAsyncIteration
                if message and message.get("type") == "message":
                    return str(message["data"])
