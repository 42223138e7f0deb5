"""Which worker gets a job: the one that will start and finish it soonest (pure functions).

A worker's capacity combines what it declared (``max_parallel_requests``), what the server holds on it
(in flight), what it last reported in a pong (free slots, free KV-cache tokens, backend queue length),
and the decode and prefill speeds the server measured on it. A conversation's next turn is expected to
finish sooner on the worker that answered its previous turn by the prefill its prefix cache saves (the
cached tokens at that worker's prefill speed): it goes there unless another worker still finishes first. :func:`choose_worker` is the whole dispatch rule; the
dispatcher (:mod:`.dispatcher`) applies it to a replica's workers, and the capacity test and the
scheduling benchmark apply it in simulation, so they check the rule the server runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# The speed assumed for a worker before its first job finished: the median of the known ones, or this.
DEFAULT_TOKENS_PER_SECOND = 20.0
# The prefill speed assumed for a worker before the server measured its own (the bundled CPU backend on
# two cores prefills a few hundred tokens a second; a GPU, thousands: this undervalues a GPU's cache).
DEFAULT_PREFILL_TOKENS_PER_SECOND = 200.0
# How fast the measured speed follows new observations (exponential moving average).
SPEED_SMOOTHING = 0.3


@dataclass
class WorkerCapacity:
    session_id: str
    declared_slots: int
    in_flight: int = 0
    # From the worker's pongs (None where the backend does not tell); the reported free slots are
    # decremented by each dispatch since that pong, so a stale pong never over-commits the worker.
    reported_free_slots: int | None = None
    kv_cache_free_tokens: int | None = None
    backend_queue_length: int | None = None
    tokens_per_second: float | None = None  # per request, measured by the server
    prefill_tokens_per_second: float | None = None  # prompt tokens not cached / time to first token
    available: bool = True  # healthy and not draining
    # False for a flagged worker, or an untrusted one where the model needs trusted workers
    # (:mod:`.trust`): it takes no user work, though its free slots stay free for compliance checks.
    takes_user_work: bool = True
    trusted: bool = False  # its key is trusted and not flagged: it may take the work of trusted-only tiers

    @property
    def free_slots(self) -> int:
        if not self.available:
            return 0
        free = self.declared_slots - self.in_flight
        if self.reported_free_slots is not None:
            free = min(free, self.reported_free_slots)
        return max(0, free)

    def fits(self, tokens: int) -> bool:
        """Whether a job of ``tokens`` (prompt plus new tokens) fits the free KV cache, where known."""
        return self.kv_cache_free_tokens is None or tokens <= self.kv_cache_free_tokens

    def observe_speed(self, tokens_per_second: float) -> None:
        self.tokens_per_second = _smoothed(self.tokens_per_second, tokens_per_second)

    def observe_prefill(self, tokens_per_second: float) -> None:
        self.prefill_tokens_per_second = _smoothed(self.prefill_tokens_per_second, tokens_per_second)

    def prefill_seconds(self, tokens: int) -> float:
        return tokens / (self.prefill_tokens_per_second or DEFAULT_PREFILL_TOKENS_PER_SECOND)


def _smoothed(current: float | None, observed: float) -> float | None:
    if observed <= 0:
        return current
    return observed if current is None else current + SPEED_SMOOTHING * (observed - current)


def default_speed(workers: Iterable[WorkerCapacity]) -> float:
    known = sorted(w.tokens_per_second for w in workers if w.tokens_per_second)
    return known[len(known) // 2] if known else DEFAULT_TOKENS_PER_SECOND


def choose_worker(
    workers: Iterable[WorkerCapacity],
    tokens: int,
    *,
    trusted_only: bool = False,
    affinity: str | None = None,
    cached_tokens: int = 0,
) -> WorkerCapacity | None:
    """The worker with a free slot and room in its KV cache that finishes ``tokens`` soonest; on the
    worker session ``affinity`` (which answered the conversation's previous turn), sooner by the prefill
    of ``cached_tokens``.

    Ties go to the worker with more free slots, then to the lower session id (deterministic).
    None when no worker can take the job now: it waits (it is never sent over a worker's capacity).
    Workers that take no user work (flagged, or untrusted where the model needs trusted ones) are skipped,
    and with ``trusted_only`` (the user's tier needs trusted workers) every untrusted one.
    """
    candidates = workers if isinstance(workers, list) else list(workers)
    # The dispatch path runs this for every new job over all of a model's workers (100 workers: 60 us
    # with the properties and key tuples, 12 us like this): one pass with ``free_slots`` and ``fits``
    # inlined, and the median speed only where a worker has not measured its own. The estimate is the
    # job's decode time, after the requests the backend already queues (``backend_queue_length``).
    default: float | None = None
    best_finish = best_free = 0.0
    chosen: WorkerCapacity | None = None
    for worker in candidates:
        if not worker.available or not worker.takes_user_work or (trusted_only and not worker.trusted):
            continue
        free = worker.declared_slots - worker.in_flight
        reported = worker.reported_free_slots
        if reported is not None and reported < free:
            free = reported
        if free <= 0:
            continue
        kv_free = worker.kv_cache_free_tokens
        if kv_free is not None and tokens > kv_free:
            continue
        tokens_per_second = worker.tokens_per_second
        if not tokens_per_second:
            if default is None:
                default = default_speed(candidates)
            tokens_per_second = default
        finish = tokens / tokens_per_second
        queued = worker.backend_queue_length
        if queued:
            finish *= 1 + queued / max(1, worker.declared_slots)
        if cached_tokens and worker.session_id == affinity:
            finish -= worker.prefill_seconds(cached_tokens)
        if (
            chosen is None
            or finish < best_finish
            or (
                finish == best_finish
                and (free > best_free or (free == best_free and worker.session_id < chosen.session_id))
            )
        ):
            chosen, best_finish, best_free = worker, finish, free
    return chosen
