"""``capacity.choose_worker`` is written for speed (one pass, the capacity properties inlined): it must
choose exactly what its rule says, written plainly here: among the workers that take user work (trusted
ones where asked), have a free slot and room in their KV cache, the one that finishes soonest at its
measured speed (the median of the known speeds where it has none), after what its backend queues; ties
to more free slots, then to the lower session id."""

from __future__ import annotations

import random

import pytest

from oasst_inference_server.dispatch.capacity import WorkerCapacity, choose_worker, default_speed


def plainly(workers: list[WorkerCapacity], tokens: int, trusted_only: bool) -> WorkerCapacity | None:
    default = default_speed(workers)
    eligible = [
        w
        for w in workers
        if w.takes_user_work and (w.trusted or not trusted_only) and w.free_slots > 0 and w.fits(tokens)
    ]

    def finish(w: WorkerCapacity) -> float:
        return (
            tokens
            / (w.tokens_per_second or default)
            * (1 + (w.backend_queue_length or 0) / max(1, w.declared_slots))
        )

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
