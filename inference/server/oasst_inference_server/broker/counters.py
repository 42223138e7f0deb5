"""Counters that every replica shares: usage limits (requests and tokens per minute, budgets per period).

Two kinds, both whole numbers:

* a *window* counter sums what was added in the last ``window`` seconds (one bucket per second, so a
  bucket leaves the window whole, at most a second late);
* a *plain* counter holds a total until it expires ``ttl`` seconds after its last change (a budget's
  counter names its period, e.g. ``...:day:2026-12-07``, and outlives it a little).

:meth:`~.base.Broker.check_counters` checks several at once and adds to all of them only if every one
has room, in one atomic step (a Lua script on Redis; one process's event loop in memory), so a burst
split between replicas cannot pass a limit. :meth:`~.base.Broker.add_counters` adds without checking
(usage reported when a generation ends), at most once per ``once`` name. The in-process broker keeps
them with :class:`MemoryCounters`; the Redis broker with the scripts of :mod:`.counters_lua`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

_FIRST_SWEEP = 1024  # entries of the in-process counters before their first sweep


class CounterCheck(NamedTuple):
    """``name`` has room when what it holds plus ``max(need, 1)`` is at most ``limit``; when every check
    has room, ``need`` is added to each (0: only checks that some room is left)."""

    name: str
    limit: int
    need: int = 0
    window: int = 0  # seconds of a sliding window; 0: a plain counter
    ttl: int = 0  # seconds a plain counter lives after a change (unused for a window)
    # A plain counter that must exist: a missing one is refused as ``missing`` (the caller rebuilds it
    # from the database with ``seed_counter`` and checks again).
    seeded: bool = False


class CounterAdd(NamedTuple):
    name: str
    amount: int
    window: int = 0
    ttl: int = 0
    # A plain counter only added to if it exists (one that is rebuilt from the database when missing).
    existing_only: bool = False


class CounterRefusal(NamedTuple):
    """The first check without room: its position in the checks, what its counter holds, and, for a window,
    in how many seconds enough of it will have left the window for the check to pass (None for a plain
    counter, or a need larger than the limit)."""

    position: int
    used: int
    retry_after: int | None
    missing: bool = False  # a ``seeded`` counter that does not exist (nothing was checked after it)


def window_retry_after(
    buckets: Sequence[tuple[int, int]], used: int, limit: int, need: int, now: int, window: int
) -> int | None:
    """Seconds until ``used + max(need, 1) <= limit`` as the oldest ``buckets`` ((second, amount), oldest
    first) leave the window; None if even an empty window would not do."""
    wanted = used + max(need, 1) - limit
    if max(need, 1) > limit:
        return None
    freed = 0
    for second, amount in buckets:
        freed += amount
        if freed >= wanted:
            return max(1, second + window - now)
    return window  # not reached: the buckets hold ``used``


class MemoryCounters:
    """The counters of the in-process broker (one server process), with the Redis scripts' semantics
    (:mod:`.counters_lua`): a zero amount (a need of 0 or less) changes nothing, a ttl is at least a
    second. What expired is swept once the entries have doubled since the last sweep, so they stay
    bounded by what is alive (as Redis' expiries bound its keys)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._windows: dict[str, dict[int, int]] = {}  # name -> second -> amount
        self._window_lengths: dict[str, int] = {}  # name -> its window (s), as last used
        self._plain: dict[str, tuple[int, float]] = {}  # name -> (value, expires at)
        self._once: dict[str, float] = {}  # marker -> expires at
        self._sweep_at = _FIRST_SWEEP  # entries (all three) that trigger the next sweep

    def _window(self, name: str, window: int, now: int) -> dict[int, int]:
        buckets = self._windows.setdefault(name, {})
        self._window_lengths[name] = window
        for second in [s for s in buckets if s <= now - window]:
            del buckets[second]
        return buckets

    def _plain_value(self, name: str, now: float) -> int | None:
        """What the plain counter holds; None if it does not exist (or expired)."""
        value = self._plain.get(name)
        if value is None or value[1] <= now:
            self._plain.pop(name, None)
            return None
        return value[0]

    def check(self, checks: Sequence[CounterCheck]) -> CounterRefusal | None:
        now = self._clock()
        second = math.floor(now)
        for position, check in enumerate(checks):
            if check.window > 0:
                buckets = self._window(check.name, check.window, second)
                used = sum(buckets.values())
                if used + max(check.need, 1) > check.limit:
                    retry = window_retry_after(
                        sorted(buckets.items()), used, check.limit, check.need, second, check.window
                    )
                    return CounterRefusal(position, used, retry)
            else:
                value = self._plain_value(check.name, now)
                if value is None and check.seeded:
                    return CounterRefusal(position, 0, None, missing=True)
                used = value or 0
                if used + max(check.need, 1) > check.limit:
                    return CounterRefusal(position, used, None)
        self._add([CounterAdd(c.name, c.need, c.window, c.ttl) for c in checks if c.need > 0], now)
        return None

    def add(self, adds: Sequence[CounterAdd], once: str | None, once_ttl: float) -> bool:
        now = self._clock()
        if once is not None:
            expires = self._once.get(once)
            if expires is not None and expires > now:
                return False
            self._once[once] = now + max(1, once_ttl)
        self._add(adds, now)
        return True

    def _add(self, adds: Sequence[CounterAdd], now: float) -> None:
        second = math.floor(now)
        for add in adds:
            if add.amount == 0:
                continue
            if add.window > 0:
                buckets = self._window(add.name, add.window, second)
                buckets[second] = buckets.get(second, 0) + add.amount
            else:
                value = self._plain_value(add.name, now)
                if value is None and add.existing_only:
                    continue
                self._plain[add.name] = ((value or 0) + add.amount, now + max(1, add.ttl))
        self._sweep(now)

    def _sweep(self, now: float) -> None:
        """Forget expired markers and plain counters and windows whose buckets all left, once the
        entries have doubled since the last sweep (amortized: a constant per change)."""
        if self.entries() < self._sweep_at:
            return
        self._once = {k: v for k, v in self._once.items() if v > now}
        self._plain = {k: v for k, v in self._plain.items() if v[1] > now}
        second = math.floor(now)
        self._windows = {
            name: buckets
            for name, buckets in self._windows.items()
            if any(s > second - self._window_lengths[name] for s in buckets)
        }
        self._window_lengths = {name: self._window_lengths[name] for name in self._windows}
        self._sweep_at = max(_FIRST_SWEEP, 2 * self.entries())

    def read(self, reads: Sequence[tuple[str, int]]) -> list[int]:
        now = self._clock()
        values = []
        for name, window in reads:
            if window > 0:
                values.append(sum(self._window(name, window, math.floor(now)).values()))
            else:
                values.append(self._plain_value(name, now) or 0)
        return values

    def entries(self) -> int:
        """Counters and markers held, expired or not (for tests: what expired does not pile up)."""
        return len(self._once) + len(self._plain) + len(self._windows)

    def seed(self, name: str, value: int, ttl: int) -> bool:
        now = self._clock()
        if self._plain_value(name, now) is not None:
            return False
        self._plain[name] = (value, now + max(1, ttl))
        self._sweep(now)
        return True
