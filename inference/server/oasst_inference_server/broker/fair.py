"""Fair order of one work queue: the Virtual Token Counter ("Fairness in Serving LLMs", OSDI 2024).

Each queue keeps, per user, a counter of the (weighted) tokens that user was served and a FIFO list of
that user's waiting hints. The next hint always comes from the backlogged user with the least counter
(ties by user id, as a Redis sorted set orders them). Popping a hint adds its cost (estimated tokens
divided by the user's weight) to that user's counter; :meth:`FairQueue.charge` later corrects the
estimate with the real token counts.

A user who becomes backlogged again after being idle has the counter lifted to ``floor - credit``,
where ``floor`` is the least counter among the backlogged users (or, when nobody waits, the counter of
the last user served): an idle user keeps no claim on service beyond ``credit`` tokens.

This module is the in-memory broker's implementation; the Redis broker runs the same rules in Lua and
:func:`dispatch_order` predicts the order both will pop hints in (queue positions shown to readers).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple


class QueuedHint(NamedTuple):
    message_id: str
    user: str
    cost: float


class QueueSnapshot(NamedTuple):
    """The state of one fair queue: what :func:`dispatch_order` needs, and what operators see."""

    floor: float
    counters: dict[str, float]  # backlogged users only
    waiting: dict[str, list[QueuedHint]]  # per backlogged user, oldest first


@dataclass(eq=False)
class FairQueue:
    credit: float = 0.0
    counters: dict[str, float] = field(default_factory=dict)
    lists: dict[str, deque[QueuedHint]] = field(default_factory=dict)
    heap: list[tuple[float, str]] = field(default_factory=list)  # (counter, user), lazily pruned
    last_served: float = 0.0
    length: int = 0

    def push(self, message_id: str, user: str, cost: float) -> None:
        waiting = self.lists.get(user)
        if waiting is None:
            counter = max(self.counters.get(user, 0.0), self._floor() - self.credit)
            self.counters[user] = counter
            waiting = self.lists[user] = deque()
            heapq.heappush(self.heap, (counter, user))
        waiting.append(QueuedHint(message_id, user, max(0.0, cost)))
        self.length += 1

    def pop(self) -> QueuedHint | None:
        while self.heap:
            counter, user = self.heap[0]
            waiting = self.lists.get(user)
            if waiting is None or self.counters.get(user) != counter:
                heapq.heappop(self.heap)  # stale: the user left, or was charged since
                continue
            hint = waiting.popleft()
            self.length -= 1
            self.last_served = counter
            new_counter = counter + hint.cost
            self.counters[user] = new_counter
            heapq.heappop(self.heap)
            if waiting:
                heapq.heappush(self.heap, (new_counter, user))
            else:
                del self.lists[user]
            return hint
        return None

    def serve_now(self, user: str, cost: float) -> bool:
        """Count a job of ``user`` served at once, as a push and its pop would, if nobody waits: the
        job jumps no queue. False (nothing changed) while any hint waits."""
        if self.lists:
            return False
        counter = max(self.counters.get(user, 0.0), self.last_served - self.credit)
        self.last_served = counter
        self.counters[user] = counter + max(0.0, cost)
        return True

    def unpop(self, hint: QueuedHint) -> None:
        """Undo :meth:`pop` of ``hint`` (its taker was cancelled before acting on it)."""
        counter = self.counters.get(hint.user, 0.0) - hint.cost
        self.counters[hint.user] = counter
        waiting = self.lists.get(hint.user)
        if waiting is None:
            waiting = self.lists[hint.user] = deque()
        waiting.appendleft(hint)
        heapq.heappush(self.heap, (counter, hint.user))
        self.length += 1

    def remove(self, message_id: str) -> int:
        removed = 0
        for user in list(self.lists):
            waiting = self.lists[user]
            kept = deque(h for h in waiting if h.message_id != message_id)
            removed += len(waiting) - len(kept)
            if kept:
                self.lists[user] = kept
            else:
                del self.lists[user]
        self.length -= removed
        return removed

    def charge(self, user: str, amount: float) -> None:
        if user not in self.counters:
            return
        self.counters[user] += amount
        if user in self.lists:
            heapq.heappush(self.heap, (self.counters[user], user))

    def _floor(self) -> float:
        backlogged = [self.counters[user] for user in self.lists]
        return min(backlogged) if backlogged else self.last_served

    def snapshot(self) -> QueueSnapshot:
        return QueueSnapshot(
            floor=self._floor(),
            counters={user: self.counters[user] for user in self.lists},
            waiting={user: list(waiting) for user, waiting in self.lists.items()},
        )


def dispatch_order(snapshot: QueueSnapshot, limit: int | None = None) -> list[QueuedHint]:
    """The hints in the order the queue will pop them if nothing else is pushed or charged."""
    heap = [(counter, user) for user, counter in snapshot.counters.items() if snapshot.waiting.get(user)]
    heapq.heapify(heap)
    position = dict.fromkeys(snapshot.waiting, 0)
    order: list[QueuedHint] = []
    while heap and (limit is None or len(order) < limit):
        counter, user = heapq.heappop(heap)
        waiting = snapshot.waiting[user]
        hint = waiting[position[user]]
        position[user] += 1
        order.append(hint)
        if position[user] < len(waiting):
            heapq.heappush(heap, (counter + hint.cost, user))
    return order
