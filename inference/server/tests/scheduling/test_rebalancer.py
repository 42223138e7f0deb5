"""The rebalancer's loop on the server's real state: worker session records in each real broker (with
protocol 6's ``servable`` and ``loaded``), the fair queues' hints, and the requests in a real database
(SQLite and Postgres). Only the switcher is a recorder (the worker sockets implement it), and it fails
on purpose where a test says so."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server import events
from oasst_inference_server.broker import Broker, WorkerSessionRecord
from oasst_inference_server.broker.worker_session import ServableSummary
from oasst_inference_server.db.engine import create_engine, make_session_factory
from oasst_inference_server.db.migrations import upgrade_to_head
from oasst_inference_server.db.models import DbMessage, utcnow
from oasst_inference_server.metrics import REGISTRY
from oasst_inference_server.scheduling.rebalancer import Rebalancer
from oasst_inference_server.scheduling.rebalancer_snapshot import (
    DatabaseDemand,
    Demand,
    donor_rate,
    upper_rate,
)
from oasst_inference_server.settings import Settings
from oasst_shared.model_configs import SMOLLM2_135M
from oasst_shared.protocol import ServableModel
from oasst_shared.schemas import MessageState, Role
from tests.support.services import fresh_database
from tests.support.sessions import worker_session

BrokerFactory = Callable[..., Awaitable[Broker]]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def any_database(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite+aiosqlite:///{tmp_path}/rebalancer.db"
        else:
            url = stack.enter_context(fresh_database("oasst_rebalancer"))
        async with _database(url) as sessions:
            yield sessions


@pytest.fixture
async def database(tmp_path: Path) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    async with _database(f"sqlite+aiosqlite:///{tmp_path}/rebalancer.db") as sessions:
        yield sessions


@contextlib.asynccontextmanager
async def _database(url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine = create_engine(Settings(_env_file=None, database_url=url, environment="development"))  # type: ignore[call-arg]
    try:
        await upgrade_to_head(engine)
        yield make_session_factory(engine)
    finally:
        await engine.dispose()


def record(
    session_id: str,
    model: str,
    servable: dict[str, float | None] | None = None,
    *,
    loaded: bool = True,
    in_flight: int = 0,
    draining: bool = False,
    worker_id: str | None = None,
    flagged: bool = False,
) -> WorkerSessionRecord:
    """A session as a protocol 6 worker's socket publishes it (``servable`` None: an older worker)."""
    update: dict[str, object] = {
        "in_flight": [f"m-{session_id}-{i}" for i in range(in_flight)],
        "draining": draining,
        "worker_id": worker_id,
        "flagged": flagged,
    }
    if servable is not None:
        update["switchable"] = True
        update["servable"] = [
            ServableSummary.of(
                ServableModel(config=SMOLLM2_135M.model_copy(update={"name": name}), load_seconds=seconds)
            )
            for name, seconds in servable.items()
        ]
        update["loaded"] = loaded
    return worker_session(model).model_copy(update=update).record(session_id)


async def add_messages(
    sessions: async_sessionmaker[AsyncSession],
    model: str,
    state: MessageState,
    count: int,
    *,
    ago: float = 5.0,
    held: float | None = None,
) -> list[str]:
    """``count`` assistant messages of ``model`` queued ``ago`` seconds ago (completed ones held a
    slot for ``held`` seconds)."""
    now = utcnow()
    messages = [
        DbMessage(
            role=Role.assistant,
            state=state,
            model_config_name=model,
            enqueued_at=now - timedelta(seconds=ago),
            started_at=now - timedelta(seconds=held) if held is not None else None,
            finished_at=now if held is not None else None,
        )
        for _ in range(count)
    ]
    async with sessions() as session:
        session.add_all(messages)
        await session.commit()
        return [m.id for m in messages]


class RecordingSwitcher:
    def __init__(self) -> None:
        self.orders: list[tuple[str, str | None, str]] = []
        self.refuse: str | None = None  # fault injection: the error to raise

    async def load(self, session_id: str, model_config_name: str, reason: str) -> None:
        if self.refuse:
            raise LookupError(self.refuse)
        self.orders.append((session_id, model_config_name, reason))

    async def unload(self, session_id: str, reason: str) -> None:
        if self.refuse:
            raise LookupError(self.refuse)
        self.orders.append((session_id, None, reason))


def settings(**overrides) -> Settings:
    return Settings(_env_file=None, environment="development", **overrides)  # type: ignore[call-arg]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def moves_counted(from_model: str, to_model: str, kind: str, outcome: str) -> float:
    labels = {"from_model": from_model, "to_model": to_model, "kind": kind, "outcome": outcome}
    return REGISTRY.get_sample_value("oasst_server_rebalancer_moves_total", labels) or 0.0


# ---------------------------------------------------------------- what the database tells


async def test_the_database_tells_each_model_s_queue_arrivals_and_service_time(any_database):
    await add_messages(any_database, "A", MessageState.pending, 3, ago=40.0)
    await add_messages(any_database, "A", MessageState.pending, 2, ago=5.0)
    await add_messages(any_database, "A", MessageState.complete, 4, ago=20.0, held=6.0)
    await add_messages(any_database, "A", MessageState.complete, 1, ago=20.0, held=10.0)
    await add_messages(any_database, "A", MessageState.in_progress, 2, ago=10.0)
    await add_messages(
        any_database, "A", MessageState.complete, 5, ago=500.0, held=100.0
    )  # before the window
    await add_messages(any_database, "B", MessageState.pending, 1, ago=1.0)
    demand = await DatabaseDemand(any_database).read(["A", "B", "C"], window=60.0, donor_window=600.0)
    a = demand["A"]
    assert a.queued == 5 and 40.0 <= a.oldest_wait < 45.0
    assert a.arrivals == 3 + 2 + 4 + 1 + 2  # every state, within the window
    assert 5.0 <= a.idle_seconds < 10.0  # since the newest (pending ones, 5 s ago)
    assert a.service_seconds == pytest.approx((4 * 6.0 + 10.0) / 5)
    assert demand["B"].queued == 1 and demand["B"].service_seconds is None
    assert demand["C"] == (0, 0.0, 0, 0, None, math.inf)
    assert a.donor_arrivals == a.arrivals + 5  # the donor window reaches back 10 minutes
    assert await DatabaseDemand(any_database).read([], window=60.0, donor_window=600.0) == {}


def test_a_donor_is_judged_by_its_longer_window_unless_its_traffic_surely_fell():
    assert upper_rate(0, 60.0) == pytest.approx(1 / 60)  # nothing seen: still not surely nothing
    assert upper_rate(4, 60.0) == pytest.approx(9 / 60)  # a handful: more than twice the count
    assert upper_rate(10_000, 60.0) / (10_000 / 60.0) == pytest.approx(1.02, abs=0.001)  # thousands: 2 %
    # A small fleet's model, 0.08 requests/s: a quiet minute (2 arrivals of 4.8 expected) is noise, the
    # five minutes count; 1 arrival would have 5 % odds at that rate, and reads as a fall.
    assert donor_rate(Demand(arrivals=2, donor_arrivals=24), 60.0, 300.0) == pytest.approx(0.08)
    assert donor_rate(Demand(arrivals=1, donor_arrivals=24), 60.0, 300.0) == pytest.approx(4 / 60)
    # A large one's, 37.5/s falling to 7.5/s: the last minute's 450 say so (its high estimate counts).
    assert donor_rate(Demand(arrivals=450, donor_arrivals=7200), 60.0, 300.0) == pytest.approx(
        493 / 60, abs=0.1
    )
    # Traffic that grew is judged by the last minute.
    assert donor_rate(Demand(arrivals=60, donor_arrivals=60), 60.0, 300.0) == 1.0


async def test_a_round_moves_at_most_its_share_of_the_switchable_workers(
    make_broker: BrokerFactory, database
):
    broker = await make_broker()
    for i in range(30):
        await broker.put_worker_session(record(f"w{i:02}", "A", {"A": 10.0, "B": 12.0}), ttl=600)
    await broker.put_worker_session(record("old", "A"), ttl=600)  # cannot switch: not counted
    for message_id in await add_messages(database, "B", MessageState.pending, 500, ago=30.0):
        await broker.push_work(events.work_queue_name("B"), message_id, user="u", cost=400.0)
    shares = settings(rebalancer_max_moves=2, rebalancer_max_moves_share=0.2)
    rebalancer = Rebalancer(broker, DatabaseDemand(database), shares, RecordingSwitcher(), clock=Clock())
    assert len(await rebalancer.tick()) == 6  # 20 % of 30, more than 2
    assert rebalancer.last_snapshot is not None and rebalancer.max_moves(rebalancer.last_snapshot) == 6


# ---------------------------------------------------------------- rounds


async def _fleet_with_a_burst_on_b(broker: Broker, database) -> None:
    """Three idle workers on A that can serve B; 20 requests wait for B, nobody serves it."""
    for name in ("w1", "w2", "w3"):
        await broker.put_worker_session(record(name, "A", {"A": 10.0, "B": 12.0}), ttl=600)
    for message_id in await add_messages(database, "B", MessageState.pending, 20, ago=30.0):
        await broker.push_work(events.work_queue_name("B"), message_id, user="u", cost=400.0)


async def test_a_round_moves_idle_workers_to_a_starved_model_and_says_why(
    make_broker: BrokerFactory, database
):
    broker = await make_broker()
    await _fleet_with_a_burst_on_b(broker, database)
    switcher = RecordingSwitcher()
    before = moves_counted("A", "B", "demand", "sent")
    rebalancer = Rebalancer(
        broker, DatabaseDemand(database), settings(rebalancer_min_workers={"A": 1}), switcher, clock=Clock()
    )
    decisions = await rebalancer.tick()
    assert [(o[0], o[1]) for o in switcher.orders] == [("w1", "B"), ("w2", "B")]  # A keeps its minimum
    assert [d.outcome for d in decisions] == ["sent", "sent"] and list(rebalancer.decisions) == decisions
    first = decisions[0]
    assert (first.from_model, first.to_model, first.kind) == ("A", "B", "demand")
    assert "B is starved: 20 queued (8,000 tokens)" in first.reason and "loaded in 12 s" in first.reason
    assert switcher.orders[0][2] == first.reason
    assert moves_counted("A", "B", "demand", "sent") == before + 2
    assert REGISTRY.get_sample_value("oasst_server_rebalancer_capacity_slots", {"model": "A"}) == 6
    assert REGISTRY.get_sample_value("oasst_server_rebalancer_demand_slots", {"model": "B"}) > 0
    # The next round counts the two on their way to B: nothing more moves.
    assert await rebalancer.tick() == [] and len(switcher.orders) == 2
    # The admin view: each model as the last round saw it, and the decisions with their reasons.
    status = json.loads(rebalancer.status().model_dump_json())
    assert status["enabled"] is True and status["rebalancing_here"] is True
    models = {m["model_config_name"]: m for m in status["models"]}
    assert models["A"]["workers"] == 1 and models["B"]["workers"] == 2 and models["B"]["queued"] == 20
    assert models["B"]["capacity_slots"] == 4 and models["B"]["demand_slots"] > 4
    assert [d["session_id"] for d in status["decisions"]] == ["w1", "w2"]
    assert status["decisions"][0]["reason"] == first.reason


async def test_a_moved_worker_stays_for_its_cooldown_then_may_move_back(make_broker: BrokerFactory, database):
    broker = await make_broker()
    await _fleet_with_a_burst_on_b(broker, database)
    clock, switcher = Clock(), RecordingSwitcher()
    rebalancer = Rebalancer(
        broker,
        DatabaseDemand(database),
        settings(rebalancer_min_workers={"A": 1}, rebalancer_cooldown=120.0),
        switcher,
        clock=clock,
    )
    assert [o[:2] for o in await _orders(rebalancer, switcher)] == [("w1", "B"), ("w2", "B")]
    # The workers drain, load B and say so; the moves are over, the cooldowns run from then.
    for name in ("w1", "w2"):
        await broker.put_worker_session(record(name, "A", {"A": 10.0, "B": 12.0}, draining=True), ttl=600)
    clock.now += 10
    assert await rebalancer.tick() == []
    for name in ("w1", "w2"):
        await broker.put_worker_session(record(name, "B", {"A": 10.0, "B": 12.0}), ttl=600)
    clock.now += 10
    assert await rebalancer.tick() == [] and not rebalancer.memory.pending
    # Demand flips: B's burst is over, A's requests pile up. The workers wait out their cooldown, then
    # one goes back; B keeps the other (its config's keep_alive is null: it stays loaded).
    await _burst_is_over(broker, database, "B")
    for message_id in await add_messages(database, "A", MessageState.pending, 40, ago=30.0):
        await broker.push_work(events.work_queue_name("A"), message_id, user="u", cost=400.0)
    clock.now += 60
    assert await rebalancer.tick() == []
    clock.now += 61
    (back,) = await rebalancer.tick()
    assert (back.session_id, back.from_model, back.to_model) == ("w1", "B", "A")
    assert "A is starved: 40 queued" in back.reason


async def _orders(rebalancer: Rebalancer, switcher: RecordingSwitcher) -> list[tuple[str, str | None, str]]:
    await rebalancer.tick()
    return switcher.orders


async def _burst_is_over(broker: Broker, database, model: str) -> None:
    """The model's requests were all answered, and arrived longer ago than the arrival window."""
    while await broker.pop_work(events.work_queue_name(model), 0):
        pass
    pending = select(DbMessage).where(
        DbMessage.model_config_name == model, DbMessage.state == MessageState.pending
    )
    async with database() as session:
        for message in (await session.exec(pending)).all():
            message.state = MessageState.complete
            message.enqueued_at = utcnow() - timedelta(hours=1)
            session.add(message)
        await session.commit()


async def test_a_switch_the_switcher_cannot_make_is_recorded_and_the_worker_stays(
    make_broker: BrokerFactory, database
):
    broker = await make_broker()
    await _fleet_with_a_burst_on_b(broker, database)
    switcher = RecordingSwitcher()
    switcher.refuse = "worker w1 is gone"
    before = moves_counted("A", "B", "demand", "failed")
    rebalancer = Rebalancer(
        broker, DatabaseDemand(database), settings(rebalancer_max_moves=1), switcher, clock=Clock()
    )
    (decision,) = await rebalancer.tick()
    assert decision.outcome == "failed" and decision.error == "LookupError: worker w1 is gone"
    assert moves_counted("A", "B", "demand", "failed") == before + 1
    assert not rebalancer.memory.pending  # not counted for B: the next round tries another worker
    switcher.refuse = None
    (retry,) = await rebalancer.tick()
    assert retry.session_id == "w2" and retry.outcome == "sent"


async def test_pinned_flagged_leaving_and_older_workers_are_not_moved(make_broker: BrokerFactory, database):
    broker = await make_broker()
    both = {"A": 10.0, "B": 12.0}
    await broker.put_worker_session(record("pinned-by-id", "A", both, worker_id="gpu-box-1"), ttl=600)
    await broker.put_worker_session(record("pinned-by-session", "A", both), ttl=600)
    await broker.put_worker_session(record("flagged", "A", both, flagged=True), ttl=600)
    await broker.put_worker_session(record("leaving", "A", both, draining=True), ttl=600)
    await broker.put_worker_session(record("protocol-5", "A"), ttl=600)
    for message_id in await add_messages(database, "B", MessageState.pending, 20, ago=30.0):
        await broker.push_work(events.work_queue_name("B"), message_id, user="u", cost=400.0)
    switcher = RecordingSwitcher()
    rebalancer = Rebalancer(
        broker,
        DatabaseDemand(database),
        settings(rebalancer_pinned_workers=["gpu-box-1", "pinned-by-session"]),
        switcher,
        clock=Clock(),
    )
    assert await rebalancer.tick() == [] and switcher.orders == []
    snapshot = rebalancer.last_snapshot
    assert snapshot is not None
    states = {w.session_id: w for w in snapshot.workers}
    assert set(states) == {"pinned-by-id", "pinned-by-session", "protocol-5"}  # flagged, leaving: no capacity
    assert states["pinned-by-id"].pinned and states["pinned-by-session"].pinned
    assert states["protocol-5"].servable == frozenset() and states["protocol-5"].model == "A"
    # A worker with nothing loaded serves no model, and is the first to go.
    await broker.put_worker_session(record("empty", "A", both, loaded=False), ttl=600)
    (decision,) = await rebalancer.tick()
    assert (decision.session_id, decision.from_model, decision.to_model) == ("empty", None, "B")


async def test_one_replica_at_a_time_rebalances(make_broker: BrokerFactory, database):
    broker = await make_broker()
    quick = settings(rebalance_interval=0.05)
    first = Rebalancer(broker, DatabaseDemand(database), quick, RecordingSwitcher())
    second = Rebalancer(broker, DatabaseDemand(database), quick, RecordingSwitcher())
    tasks = [asyncio.create_task(first.run()), asyncio.create_task(second.run())]
    try:
        await asyncio.sleep(0.5)
        holders = [r for r in (first, second) if r.last_snapshot is not None]
        assert len(holders) == 1
        holder, other = holders[0], (second if holders[0] is first else first)
        await holder.stop()  # its lock is released: the other takes over
        for _ in range(100):
            if other.last_snapshot is not None:
                break
            await asyncio.sleep(0.05)
        assert other.last_snapshot is not None
    finally:
        for rebalancer in (first, second):
            await rebalancer.stop()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)


async def test_an_interval_of_zero_turns_the_rebalancer_off(make_broker: BrokerFactory, database):
    broker = await make_broker()
    rebalancer = Rebalancer(
        broker, DatabaseDemand(database), settings(rebalance_interval=0), RecordingSwitcher()
    )
    assert not rebalancer.enabled
    await asyncio.wait_for(rebalancer.run(), 1)
    assert rebalancer.last_snapshot is None
