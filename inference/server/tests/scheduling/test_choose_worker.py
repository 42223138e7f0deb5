"""``capacity.choose_worker`` is written for speed (one pass, the capacity properties inlined): it must
choose exactly what its rule says, written plainly here: among the workers that take user work (trusted
ones where asked), have a free slot and room in their KV cache, the one that finishes soonest at its
measured speed (the median of the known speeds where it has none), after what its backend queues; ties
to more free slots, then to the lower session id; the worker of the conversation's previous turn sooner
by the prefill of its cached tokens, at its measured prefill speed (or the default)."""

from __future__ import annotations

import random

import pytest

from oasst_inference_server.scheduling.capacity import (
    DEFAULT_PREFILL_TOKENS_PER_SECOND,
    WorkerCapacity,
    choose_worker,
    default_speed,
)


def plainly(
    workers: list[WorkerCapacity],
    tokens: int,
    trusted_only: bool,
    affinity: str | None = None,
    cached_tokens: int = 0,
) -> WorkerCapacity | None:
    default = default_speed(workers)
    eligible = [
        w
        for w in workers
        if w.takes_user_work and (w.trusted or not trusted_only) and w.free_slots > 0 and w.fits(tokens)
    ]

    def finish(w: WorkerCapacity) -> float:
        decode = (
            tokens
            / (w.tokens_per_second or default)
            * (1 + (w.backend_queue_length or 0) / max(1, w.declared_slots))
        )
        if w.session_id != affinity:
            return decode
        return decode - cached_tokens / (w.prefill_tokens_per_second or DEFAULT_PREFILL_TOKENS_PER_SECOND)

    return min(eligible, key=lambda w: (finish(w), -w.free_slots, w.session_id), default=None)


def random_worker(rng: random.Random, n: int) -> WorkerCapacity:
    slots = rng.randint(0, 4)
    return WorkerCapacity(
        session_id=f"ws-{rng.randint(0, 50):03}-{n}",
        declared_slots=slots,
        in_flight=rng.randint(0, slots + 1),
        reported_free_slots=rng.choice([None, 0, 1, 2, 8]),
        kv_cache_free_tokens=rng.choice([None, 100, 1_000, 10_000]),
        backend_queue_length=rng.choice([None, 0, 1, 3]),
        tokens_per_second=rng.choice([None, 10.0, 20.0, 35.5, 80.0]),
        prefill_tokens_per_second=rng.choice([None, 50.0, 400.0]),
        available=rng.random() > 0.1,
        takes_user_work=rng.random() > 0.1,
        trusted=rng.random() > 0.5,
    )


@pytest.mark.parametrize("seed", range(300))
def test_the_fast_rule_chooses_what_the_plain_rule_chooses(seed: int) -> None:
    rng = random.Random(seed)
    workers = [random_worker(rng, n) for n in range(rng.randint(0, 30))]
    tokens = rng.choice([0, 50, 500, 5_000])
    trusted_only = rng.random() < 0.3
    assert choose_worker(workers, tokens, trusted_only=trusted_only) is plainly(workers, tokens, trusted_only)
    # Any iterable, not only a list.
    assert choose_worker(iter(workers), tokens, trusted_only=trusted_only) is plainly(
        workers, tokens, trusted_only
    )
    # With the worker of the previous turn (one of them, or one gone).
    affinity = rng.choice([w.session_id for w in workers] + ["ws-gone"])
    cached = rng.choice([0, 100, 2_000])
    chosen = choose_worker(
        workers, tokens, trusted_only=trusted_only, affinity=affinity, cached_tokens=cached
    )
    assert chosen is plainly(workers, tokens, trusted_only, affinity, cached)


def worker(session_id: str, speed: float, free: int = 1, prefill: float | None = None) -> WorkerCapacity:
    return WorkerCapacity(
        session_id=session_id, declared_slots=free, tokens_per_second=speed, prefill_tokens_per_second=prefill
    )


def test_a_follow_up_goes_to_the_worker_of_its_previous_turn_unless_another_finishes_sooner() -> None:
    a, b = worker("ws-a", 20.0), worker("ws-b", 20.0)
    # Equal workers: b by its session id alone; a by the 1,000 cached tokens (5 s at the default speed).
    assert choose_worker([a, b], 600) is a
    assert choose_worker([a, b], 600, affinity="ws-b", cached_tokens=1_000) is b
    # b twice as fast: its 15 s saved on decoding beat a's 5 s of prefill saved...
    fast = worker("ws-b", 40.0)
    assert choose_worker([a, fast], 600, affinity="ws-a", cached_tokens=1_000) is fast
    # ...unless a's cache saves more, measured at a's own (slower) prefill speed.
    slow_prefill = worker("ws-a", 20.0, prefill=50.0)
    assert choose_worker([slow_prefill, fast], 600, affinity="ws-a", cached_tokens=1_000) is slow_prefill
    # A full worker is not waited for.
    full = worker("ws-a", 20.0, free=0)
    assert choose_worker([full, b], 600, affinity="ws-a", cached_tokens=1_000) is b


def test_the_measured_prefill_speed_follows_observations() -> None:
    a = worker("ws-a", 20.0)
    assert a.prefill_seconds(200) == 200 / DEFAULT_PREFILL_TOKENS_PER_SECOND
    a.observe_prefill(1_000.0)
    assert a.prefill_seconds(1_000) == 1.0
    a.observe_prefill(0.0)  # nothing measured: no change
    assert a.prefill_tokens_per_second == 1_000.0
