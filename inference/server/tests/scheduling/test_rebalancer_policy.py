"""The rebalancer's policy, case by case: what moves, what stays, and why (a pure function: no broker,
no clock). A model's service time here is 10 s a request and each worker has 4 slots unless a case
says otherwise, so a worker serves 0.4 requests a second."""

from __future__ import annotations

import dataclasses
import random

from oasst_inference_server.scheduling.rebalancer_policy import (
    ModelDemand,
    Move,
    PolicySettings,
    Snapshot,
    WorkerState,
    demand_and_capacity,
    plan_moves,
)

BOTH = frozenset({"A", "B"})
SETTINGS = PolicySettings(default_load_seconds=20.0)


def worker(session_id: str, model: str | None, **kw) -> WorkerState:
    return WorkerState(session_id, model, **{"servable": BOTH, "slots": 4, **kw})


def demand(name: str, **kw) -> ModelDemand:
    return ModelDemand(name, **{"service_seconds": 10.0, **kw})


def plan(models: list[ModelDemand], workers: list[WorkerState], **settings) -> list[Move]:
    snapshot = Snapshot({m.name: m for m in models}, workers)
    return plan_moves(snapshot, dataclasses.replace(SETTINGS, **settings))


def moved(moves: list[Move]) -> list[tuple[str, str | None, str | None]]:
    return [(m.session_id, m.from_model, m.to_model) for m in moves]


def idle_a(count: int, **kw) -> list[WorkerState]:
    return [worker(f"a{i}", "A", **kw) for i in range(count)]


def test_nothing_asked_nothing_moves():
    assert plan([], []) == []
    assert plan([demand("A"), demand("B")], idle_a(3)) == []


def test_a_burst_on_b_while_a_idles_moves_workers_to_b_and_keeps_a_s_minimum():
    moves = plan([demand("A"), demand("B", queued=40, queued_tokens=8000)], idle_a(3), min_workers={"A": 1})
    assert moved(moves) == [("a0", "A", "B"), ("a1", "A", "B")]
    assert {m.kind for m in moves} == {"demand"}
    first = moves[0].reason
    assert "B is starved: 40 queued (8,000 tokens)" in first and "no worker" in first
    assert "worker a0 leaves A" in first and "loaded in 20 s" in first
    # The second move sees the first: B has a worker now, and the gain is the queue it would take over.
    assert "has 4 on 1 worker" in moves[1].reason and "of the queue" in moves[1].reason


def test_one_request_for_a_model_nobody_serves_gets_it_a_worker_whatever_the_load_time():
    moves = plan([demand("A"), demand("B", queued=1)], idle_a(2), default_load_seconds=600.0)
    assert moved(moves) == [("a0", "A", "B")]
    assert "it serves requests nobody serves" in moves[0].reason


def test_a_queue_that_clears_before_the_load_ends_is_not_worth_a_move():
    # B's worker takes 0.4 requests/s: 12 queued clear in 30 s, less than the 60 s the load would take.
    workers = [*idle_a(2), worker("b0", "B", in_flight=4)]
    models = [demand("A"), demand("B", queued=12, running=4)]
    assert plan(models, workers, default_load_seconds=60.0) == []
    # A quick load is worth it: the new worker still finds queued work once it is ready.
    quick = plan(models, workers, default_load_seconds=5.0)
    assert moved(quick) == [("a0", "A", "B")]


def test_the_cheapest_worker_to_load_the_model_moves():
    workers = [
        worker("a0", "A", load_seconds={"B": 50.0}),
        worker("a1", "A", load_seconds={"B": 8.0}),
        worker("a2", "A"),  # never loaded B: the default 20 s
    ]
    moves = plan([demand("A"), demand("B", queued=30)], workers, max_moves=1)
    assert moved(moves) == [("a1", "A", "B")] and moves[0].cost_seconds == 8.0


def test_an_idle_worker_moves_before_a_busy_one_which_must_drain_first():
    workers = [worker("a0", "A", in_flight=1), worker("a1", "A"), worker("a2", "A")]
    moves = plan([demand("A", running=1), demand("B", queued=30)], workers, max_moves=1)
    assert moved(moves) == [("a1", "A", "B")]
    # Only busy ones left: it drains (its price includes one service time of A).
    busy = [worker(f"a{i}", "A", in_flight=1) for i in range(3)]
    moves = plan([demand("A", running=3), demand("B", queued=30)], busy, max_moves=1)
    assert moved(moves) == [("a0", "A", "B")]
    assert moves[0].cost_seconds == 30.0 and "draining 1 request" in moves[0].reason


def test_pinned_unservable_cooling_and_switching_workers_never_move():
    models = [demand("A"), demand("B", queued=30)]
    for kept in (
        worker("a0", "A", pinned=True),
        worker("a0", "A", servable=frozenset({"A"})),
        worker("a0", "A", since_move=60.0),
        worker("a0", "A", switching=True),
    ):
        assert plan(models, [kept], cooldown=120.0) == [], kept
    assert moved(plan(models, [worker("a0", "A", since_move=121.0)], cooldown=120.0)) == [("a0", "A", "B")]


def test_a_worker_switching_to_a_model_counts_as_its_capacity():
    # B needs about one worker; one is on its way: nothing more moves.
    models = [demand("A"), demand("B", queued=3, arrivals_per_second=0.2)]
    assert plan(models, [*idle_a(3), worker("s", "B", switching=True)]) == []
    assert moved(plan(models, idle_a(3), max_moves=1)) == [("a0", "A", "B")]


def test_a_busy_model_gives_no_worker():
    # A's load: 0.9 requests/s x 10 s = 9 slots of its 16; giving one leaves 9 of 12 = 75 % > 70 %.
    models = [demand("A", arrivals_per_second=0.9, running=9), demand("B", queued=30)]
    assert plan(models, idle_a(4)) == []
    # With a fifth worker A can spare one (9 of 16 = 56 %), and only one.
    assert moved(plan(models, idle_a(5))) == [("a0", "A", "B")]


def test_two_starved_models_do_not_trade_workers():
    # Both above their capacity: neither is over-served, so neither gives (a trade would only flap).
    models = [
        demand("A", arrivals_per_second=1.0, running=8, queued=20),
        demand("B", arrivals_per_second=2.0, running=8, queued=60),
    ]
    workers = [*idle_a(2, in_flight=4), *(worker(f"b{i}", "B", in_flight=4) for i in range(2))]
    assert plan(models, workers, cooldown=0.0) == []


def test_a_model_keeps_its_last_worker_while_its_keep_alive_runs():
    workers = [worker("a0", "A"), worker("b0", "B", in_flight=4)]

    def moves(**a_demand) -> list[Move]:
        return plan([demand("A", **a_demand), demand("B", queued=30, running=4)], workers)

    assert moves(idle_seconds=100.0, keep_alive=300.0) == []  # asked for 100 s ago: it stays
    assert moves(idle_seconds=100.0, keep_alive=None) == []  # null: it stays loaded
    assert moves(idle_seconds=0.0, keep_alive=0.0, running=1) == []  # in use
    assert moved(moves(idle_seconds=400.0, keep_alive=300.0)) == [("a0", "A", "B")]
    assert moved(moves()) == [("a0", "A", "B")]  # never asked for
    # The minimum is the operator's: it takes the last worker of a model kept alive.
    restored = plan([demand("A", keep_alive=None), demand("B")], workers[:1], min_workers={"B": 1})
    assert moved(restored) == [("a0", "A", "B")]


def test_a_donor_s_traffic_is_read_high_a_receiver_s_as_measured():
    # A measured 0.5 requests/s, but from few arrivals: read high, 0.9/s would keep its 4 workers
    # busy enough (9 slots of 12 after giving one) to give none.
    models = [demand("A", arrivals_per_second=0.5, donor_arrivals_per_second=0.9), demand("B", queued=30)]
    assert plan(models, idle_a(4)) == []
    # Many arrivals: the high estimate is the measured rate, and A can spare one.
    models[0] = demand("A", arrivals_per_second=0.5, donor_arrivals_per_second=0.52)
    assert moved(plan(models, idle_a(4), max_moves=1)) == [("a0", "A", "B")]
    # A receiver is read as measured: 3 queued on 4 slots at 0.2/s is 75 % (read high, 1.0/s: 275 %).
    fell = [demand("A"), demand("B", arrivals_per_second=0.2, queued=3, donor_arrivals_per_second=1.0)]
    assert plan(fell, [*idle_a(4), worker("b0", "B", in_flight=4)], default_load_seconds=2.0) == []
    grew = [demand("A"), demand("B", arrivals_per_second=1.0, queued=3, donor_arrivals_per_second=1.2)]
    assert plan(grew, [*idle_a(4), worker("b0", "B", in_flight=4)], default_load_seconds=2.0, max_moves=1)


def test_the_minimum_is_restored_first_from_a_model_above_its_own():
    # A has none and a minimum of 1: it gets one though nobody asks for A, even from a busy B.
    workers = [worker(f"b{i}", "B", in_flight=4) for i in range(3)]
    models = [demand("A"), demand("B", running=12, queued=10)]
    moves = plan(models, workers, min_workers={"A": 1, "B": 2})
    assert moved(moves) == [("b0", "B", "A")] and moves[0].kind == "minimum"
    assert "restore the minimum of A (1 worker, it has 0)" in moves[0].reason
    # B at its own minimum gives nothing.
    assert plan(models, workers[:2], min_workers={"A": 1, "B": 2}) == []


def test_an_unloaded_worker_is_the_first_donor():
    workers = [*idle_a(2), worker("z", None)]
    moves = plan([demand("A"), demand("B", queued=30)], workers, max_moves=1)
    assert moved(moves) == [("z", None, "B")] and "has nothing loaded" in moves[0].reason
    restored = plan([demand("A"), demand("B")], workers[2:], min_workers={"B": 1})
    assert moved(restored) == [("z", None, "B")]


def test_maximums_bound_receivers_and_a_model_above_its_maximum_sheds_workers():
    models = [demand("A"), demand("B", queued=100)]
    moves = plan(models, idle_a(4), max_workers={"B": 2})
    assert moved(moves) == [("a0", "A", "B"), ("a1", "A", "B")]
    # Above its maximum with nothing starved: unloaded, idle ones first, one per round's move.
    workers = [worker("a0", "A", in_flight=2), worker("a1", "A"), worker("a2", "A")]
    shed = plan([demand("A", running=2)], workers, max_workers={"A": 1})
    assert moved(shed) == [("a1", "A", None), ("a2", "A", None)]
    assert {m.kind for m in shed} == {"maximum"} and "above its maximum of 1" in shed[0].reason
    # Above its maximum while B is starved: the extra worker goes to B, however busy A is.
    busy = [worker(f"a{i}", "A", in_flight=4) for i in range(3)]
    models = [demand("A", running=12, arrivals_per_second=1.2), demand("B", queued=30)]
    assert moved(plan(models, busy, max_workers={"A": 2})) == [("a0", "A", "B")]


def test_a_round_makes_at_most_max_moves_and_moves_each_worker_once():
    moves = plan([demand("A"), demand("B", queued=1000)], idle_a(20), max_moves=5)
    assert len(moves) == 5 and len({m.session_id for m in moves}) == 5


def test_the_most_starved_model_is_served_first():
    models = [demand("A"), demand("B", queued=20), demand("C", queued=200, oldest_wait=90.0)]
    workers = idle_a(3, servable=frozenset({"A", "B", "C"}))
    moves = plan(models, [*workers, worker("b0", "B"), worker("c0", "C")], max_moves=1)
    assert moved(moves) == [("a0", "A", "C")]


def test_the_plan_is_deterministic_whatever_the_order_of_workers():
    models = [demand("A", arrivals_per_second=0.3), demand("B", queued=50), demand("C", queued=80)]
    workers = [
        worker(f"w{i:02}", "A", servable=frozenset({"A", "B", "C"}), load_seconds={"B": 5.0 + i % 3})
        for i in range(12)
    ]
    first = plan(models, workers)
    assert first
    for seed in range(5):
        shuffled = list(workers)
        random.Random(seed).shuffle(shuffled)
        assert plan(models, shuffled) == first


def test_demand_and_capacity_per_model():
    snapshot = Snapshot(
        {"A": demand("A", arrivals_per_second=0.5, queued=30)}, [*idle_a(2), worker("b0", "B")]
    )
    measured = demand_and_capacity(snapshot, SETTINGS)
    # 0.5/s x 10 s = 5 slots of traffic, 30 queued x 10 s / 30 s = 10 to clear the queue in time.
    assert measured == {"A": (15.0, 8), "B": (0.0, 4)}


def _steady_rounds(models: list[ModelDemand], workers: list[WorkerState], rounds: int, **settings):
    """Rounds 10 s apart on fixed demand, each applying the last one's moves (they load at once)."""
    history: list[list[Move]] = []
    for _ in range(rounds):
        moves = plan(models, workers, **settings)
        history.append(moves)
        target = {m.session_id: m.to_model for m in moves}
        workers = [
            dataclasses.replace(w, model=target[w.session_id], since_move=0.0)
            if w.session_id in target
            else dataclasses.replace(w, since_move=w.since_move + 10.0)
            for w in workers
        ]
    return history, workers


def test_steady_mixed_load_settles_and_does_not_flap():
    # A and B both busy, B more than its share: a few workers move to B, then nothing moves.
    models = [
        demand("A", arrivals_per_second=1.0, running=10),
        demand("B", arrivals_per_second=2.0, running=16, queued=40),
    ]
    workers = [*idle_a(10), *(worker(f"b{i}", "B") for i in range(4))]
    history, after = _steady_rounds(models, workers, 30, cooldown=60.0)
    made = [m for moves in history for m in moves]
    assert 0 < len(made) <= 4
    assert all(m.from_model == "A" and m.to_model == "B" for m in made)  # never back
    assert all(not moves for moves in history[3:])
    assert sum(w.model == "B" for w in after) > 4


def test_a_move_is_not_undone_in_the_next_round_with_the_same_demand():
    models = [demand("A", arrivals_per_second=0.5), demand("B", arrivals_per_second=0.5, queued=30)]
    workers = [*idle_a(3), worker("b0", "B")]
    history, _ = _steady_rounds(models, workers, 2, cooldown=0.0)
    assert moved(history[0]) and history[1] == []
