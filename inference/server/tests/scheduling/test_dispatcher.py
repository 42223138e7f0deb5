"""The per-model dispatcher against each real broker: jobs stay within their model, a model without
workers (or with a full queue) does not hold up another, a worker is never given more than its room,
and a job too long for every free KV cache waits in the queue."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from oasst_inference_server import events
from oasst_inference_server.broker import Broker
from oasst_inference_server.scheduling.capacity import WorkerCapacity
from oasst_inference_server.scheduling.dispatcher import ModelDispatcher
from oasst_inference_server.scheduling.fair_share import Placement

BrokerFactory = Callable[..., Awaitable[Broker]]


@dataclass
class StubConnection:
    """Stands in for a WorkerConnection: records what it is assigned and holds it (never finishes)."""

    session_id: str
    capacity: WorkerCapacity
    assigned: list[str] = field(default_factory=list)

    max_new_tokens: dict[str, int | None] = field(default_factory=dict)

    def assign(self, message_id: str, max_new_tokens: int | None = None) -> None:
        assert self.capacity.free_slots > 0, "assigned over capacity"
        self.capacity.in_flight += 1
        self.assigned.append(message_id)
        self.max_new_tokens[message_id] = max_new_tokens


@dataclass
class StubMessage:
    id: str
    state: str = "pending"
    scheduling: dict[str, object] | None = None


@dataclass
class StubLifecycle:
    """The two lifecycle calls a dispatcher makes: read a message, put a popped hint back."""

    broker: Broker
    queue: str
    sizes: dict[str, int] = field(default_factory=dict)
    requeued: list[str] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)  # placement notes, pushed again on a requeue

    async def get(self, message_id: str) -> StubMessage:
        self.reads.append(message_id)
        tokens = self.sizes.get(message_id, 10)
        ticket = {"user": "", "prompt_tokens": tokens, "max_new_tokens": 0, "weight": 1.0}
        return StubMessage(message_id, scheduling=ticket)

    async def requeue(self, message_id: str) -> None:
        self.requeued.append(message_id)
        await self.broker.push_work(self.queue, message_id, job=self.notes.get(message_id, ""))


async def _until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def test_models_never_cross_and_an_idle_model_does_not_delay_another(broker: Broker) -> None:
    busy, idle = events.work_queue_name("model-x"), events.work_queue_name("model-y")
    for i in range(150):  # model-y has no worker: its backlog must not matter to model-x
        await broker.push_work(idle, f"y{i}", user=f"u{i % 3}")
    x_lifecycle = StubLifecycle(broker, busy)
    dispatcher = ModelDispatcher("model-x", broker, x_lifecycle)  # type: ignore[arg-type]
    workers = [StubConnection(f"x{i}", WorkerCapacity(f"x{i}", declared_slots=3)) for i in range(2)]
    for worker in workers:
        dispatcher.attach(worker)  # type: ignore[arg-type]
    try:
        for i in range(6):
            await broker.push_work(busy, f"x{i}", user="u0")
        await _until(lambda: sum(len(w.assigned) for w in workers) == 6)
        assigned = sorted(m for w in workers for m in w.assigned)
        assert assigned == sorted(f"x{i}" for i in range(6))
        assert all(len(w.assigned) == 3 for w in workers)  # each got its declared room, no more
        await broker.push_work(busy, "x-extra", user="u0")
        await asyncio.sleep(0.3)
        assert "x-extra" not in [m for w in workers for m in w.assigned]  # full: it waits
        assert await broker.queued_ids(busy) == ["x-extra"]
        assert await broker.queue_length(idle) == 150
    finally:
        for worker in workers:
            await dispatcher.detach(worker)  # type: ignore[arg-type]


async def test_a_job_too_long_for_every_kv_cache_waits(broker: Broker) -> None:
    queue = events.work_queue_name("model-kv")
    lifecycle = StubLifecycle(broker, queue, sizes={"long": 5000, "short": 100})
    dispatcher = ModelDispatcher("model-kv", broker, lifecycle)  # type: ignore[arg-type]
    small = StubConnection("small", WorkerCapacity("small", declared_slots=2, kv_cache_free_tokens=1000))
    big = StubConnection("big", WorkerCapacity("big", declared_slots=1, kv_cache_free_tokens=8000))
    dispatcher.attach(small)  # type: ignore[arg-type]
    try:
        await broker.push_work(queue, "long", user="a")
        await _until(lambda: "long" in lifecycle.requeued)
        assert small.assigned == []
        await broker.push_work(queue, "short", user="b")
        await _until(lambda: small.assigned == ["short"])
        dispatcher.attach(big)  # type: ignore[arg-type]
        await _until(lambda: big.assigned == ["long"])
        assert small.assigned == ["short"]
    finally:
        await dispatcher.detach(small)  # type: ignore[arg-type]
        await dispatcher.detach(big)  # type: ignore[arg-type]


async def test_flagged_and_untrusted_workers_get_no_user_work_where_it_needs_trust(broker: Broker) -> None:
    """A worker that takes no user work (flagged, or untrusted for a model that needs trusted workers)
    is skipped however free it is; its jobs wait for, and go to, a worker that may take them."""
    queue = events.work_queue_name("model-t")
    lifecycle = StubLifecycle(broker, queue)
    dispatcher = ModelDispatcher("model-t", broker, lifecycle)  # type: ignore[arg-type]
    excluded = StubConnection(
        "a-excluded", WorkerCapacity("a-excluded", declared_slots=8, takes_user_work=False)
    )
    dispatcher.attach(excluded)  # type: ignore[arg-type]
    try:
        await broker.push_work(queue, "t0", user="u0")
        await asyncio.sleep(0.5)  # nobody may take it: it stays queued
        assert excluded.assigned == []
        allowed = StubConnection("b-allowed", WorkerCapacity("b-allowed", declared_slots=1))
        dispatcher.attach(allowed)  # type: ignore[arg-type]
        for i in range(1, 3):
            await broker.push_work(queue, f"t{i}", user="u0")
        await _until(lambda: len(allowed.assigned) == 1)
        await asyncio.sleep(0.3)
        assert excluded.assigned == [] and len(allowed.assigned) == 1  # the rest waits for room
    finally:
        await dispatcher.detach(excluded)  # type: ignore[arg-type]
        await dispatcher.detach(allowed)  # type: ignore[arg-type]


async def test_a_trusted_only_job_waits_for_a_trusted_worker(broker: Broker) -> None:
    """A job of a trusted-only tier (its ticket says so) never goes to an untrusted worker."""
    queue = events.work_queue_name("model-q")

    @dataclass
    class TieredLifecycle(StubLifecycle):
        trusted_only: set[str] = field(default_factory=set)

        async def get(self, message_id: str) -> StubMessage:
            message = await super().get(message_id)
            assert message.scheduling is not None
            message.scheduling["trusted_only"] = message_id in self.trusted_only
            return message

    lifecycle = TieredLifecycle(broker, queue, trusted_only={"vip"})
    dispatcher = ModelDispatcher("model-q", broker, lifecycle, trusted_only_tiers=True)  # type: ignore[arg-type]
    untrusted = StubConnection("a-untrusted", WorkerCapacity("a-untrusted", declared_slots=4))
    dispatcher.attach(untrusted)  # type: ignore[arg-type]
    trusted = StubConnection("b-trusted", WorkerCapacity("b-trusted", declared_slots=1, trusted=True))
    try:
        await broker.push_work(queue, "vip", user="u1")
        await asyncio.sleep(0.5)
        assert untrusted.assigned == []
        dispatcher.attach(trusted)  # type: ignore[arg-type]
        await _until(lambda: trusted.assigned == ["vip"])
        await broker.push_work(queue, "plain", user="u2")
        await _until(lambda: untrusted.assigned == ["plain"])
    finally:
        await dispatcher.detach(untrusted)  # type: ignore[arg-type]
        await dispatcher.detach(trusted)  # type: ignore[arg-type]


async def test_placing_reads_no_message_where_nothing_depends_on_it(broker: Broker) -> None:
    """Untrusted workers that report no KV cache, and no tier that needs trusted workers: a hint is
    placed without reading its message (the claim is the one database step of a dispatch)."""
    queue = events.work_queue_name("model-r")
    lifecycle = StubLifecycle(broker, queue)
    dispatcher = ModelDispatcher("model-r", broker, lifecycle)  # type: ignore[arg-type]
    worker = StubConnection("untrusted", WorkerCapacity("untrusted", declared_slots=4, trusted=False))
    dispatcher.attach(worker)  # type: ignore[arg-type]
    try:
        await broker.push_work(queue, "plain", user="u0")
        await _until(lambda: worker.assigned == ["plain"])
        assert lifecycle.reads == []
        assert worker.max_new_tokens == {"plain": None}  # no note: the claim reads it itself
    finally:
        await dispatcher.detach(worker)  # type: ignore[arg-type]


async def test_a_hints_placement_note_places_it_without_a_read(broker: Broker) -> None:
    """A hint pushed with its placement (as the lifecycle pushes every hint) is placed by its note:
    the KV-cache fit, the trusted-only rule and the max_new_tokens handed to the claim come from it.
    A hint without a note still has its message read."""
    queue = events.work_queue_name("model-n")
    lifecycle = StubLifecycle(broker, queue, sizes={"old": 5000})
    dispatcher = ModelDispatcher("model-n", broker, lifecycle, trusted_only_tiers=True)  # type: ignore[arg-type]
    small = StubConnection("a-small", WorkerCapacity("a-small", declared_slots=4, kv_cache_free_tokens=1000))
    dispatcher.attach(small)  # type: ignore[arg-type]
    trusted = StubConnection(
        "b-trusted", WorkerCapacity("b-trusted", declared_slots=2, kv_cache_free_tokens=8000, trusted=True)
    )
    lifecycle.notes = {
        "fits": Placement(900, 500, False).note(),
        "long": Placement(5000, 4000, False).note(),
        "vip": Placement(10, 5, True).note(),
    }
    try:
        await broker.push_work(queue, "fits", user="u1", job=lifecycle.notes["fits"])
        await _until(lambda: small.assigned == ["fits"])
        assert small.max_new_tokens == {"fits": 500}
        await broker.push_work(queue, "long", user="u2", job=lifecycle.notes["long"])
        await broker.push_work(queue, "vip", user="u3", job=lifecycle.notes["vip"])
        await _until(lambda: {"long", "vip"} <= set(lifecycle.requeued))
        assert small.assigned == ["fits"]  # too long for its KV cache; trusted-only
        assert lifecycle.reads == []
        dispatcher.attach(trusted)  # type: ignore[arg-type]
        await _until(lambda: sorted(trusted.assigned) == ["long", "vip"])
        assert trusted.max_new_tokens == {"long": 4000, "vip": 5}
        await broker.push_work(queue, "old", user="u4")  # no note: read, and too long for a-small
        await _until(lambda: "old" in lifecycle.reads)
        assert "old" not in small.assigned
    finally:
        await dispatcher.detach(small)  # type: ignore[arg-type]
        await dispatcher.detach(trusted)  # type: ignore[arg-type]


def test_a_job_note_of_another_form_is_no_placement():
    assert Placement.parse(Placement(900, 500, True).note()) == Placement(900, 500, True)
    with_affinity = Placement(900, 500, False, "ws-3f2a", 412)
    assert Placement.parse(with_affinity.note()) == with_affinity
    for bad in ("900 500 0 ws-a", "900 500 0 ws-a x", "900 500 0 ws-a 1 2", "900 500 0 " + "w" * 65 + " 3"):
        parsed = Placement.parse(bad)
        assert parsed is None or parsed.affinity is None, bad
    for note in ["", "1 2", "1 2 3", "1 2 1 4", "-1 2 0", "1.5 2 0", "1 ² 0", "١ 2 0", "a b c", "1 2 01"]:
        assert Placement.parse(note) is None, note


class CountedCapacity:
    """A connection whose capacity reads are counted: how often the dispatcher lists its workers."""

    def __init__(self, session_id: str, slots: int) -> None:
        self.session_id = session_id
        self._capacity = WorkerCapacity(session_id, declared_slots=slots)
        self.reads = 0

    @property
    def capacity(self) -> WorkerCapacity:
        self.reads += 1
        return self._capacity

    def reserve(self) -> None:
        self._capacity.in_flight += 1

    def assign(self, message_id: str, max_new_tokens: int | None = None) -> None:
        raise AssertionError("not placed from the queue here")


async def test_the_workers_capacities_are_listed_once_per_change_of_the_workers() -> None:
    """A thousand workers listed per job cost more than choosing among them: the list is built when a
    worker arrives or leaves, and each job reads the live capacities through it (a slot taken counts)."""
    from oasst_inference_server.broker import InMemoryBroker

    dispatcher = ModelDispatcher("m", InMemoryBroker(), StubLifecycle(InMemoryBroker(), "q"))  # type: ignore[arg-type]
    workers = [CountedCapacity(f"ws-{n}", slots=4) for n in range(3)]
    for worker in workers:
        dispatcher.attach(worker)  # type: ignore[arg-type]
    dispatcher.waiting = True  # as while it waits on its queue
    job = Placement(tokens=10, max_new_tokens=5, trusted_only=False)
    chosen = [dispatcher.take_now(job) for _ in range(12)]
    assert [c.session_id if c else None for c in chosen].count(None) == 0  # 12 jobs, 12 free slots
    assert dispatcher.take_now(job) is None  # every slot taken: the live counts were read
    assert [w.reads for w in workers] == [1, 1, 1]
    late = CountedCapacity("ws-late", slots=1)
    dispatcher.attach(late)  # type: ignore[arg-type]
    assert dispatcher.take_now(job) is late
    assert [w.reads for w in [*workers, late]] == [2, 2, 2, 1]
    await dispatcher.detach(late)  # type: ignore[arg-type]
    assert dispatcher.take_now(job) is None
    assert late.reads == 1
    for worker in workers:
        await dispatcher.detach(worker)  # type: ignore[arg-type]
