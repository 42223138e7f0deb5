"""The sequence slots of the batched context and the prefix cache they hold.

Each slot is one llama.cpp sequence id with a KV stream of its own (``kv_unified`` off: a sequence's
attention then never depends on what the other sequences hold, so a greedy answer is the same alone and
batched). A slot runs one request at a time; when the request ends, its KV (prompt and generated tokens)
stays in the slot as a cached prefix. A new request takes the free slot whose cached tokens share the
longest prefix with its prompt, else the least recently used free slot, whose cache it overwrites: the
cache is LRU within the KV budget, which is the slots' streams together.

Reuse is rounded down to a multiple of the prefill chunk, so that a prompt is always evaluated in the
same chunks whatever was cached (greedy output then does not depend on the previous request).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Slot:
    seq_id: int
    # The tokens the slot's KV stream holds, at positions 0..len-1.
    tokens: list[int] = field(default_factory=list)
    busy: bool = False
    last_used: int = 0


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class SlotTable:
    def __init__(self, count: int, capacity: int, *, chunk: int, prefix_cache: bool) -> None:
        self.slots = [Slot(seq_id) for seq_id in range(count)]
        self.capacity = capacity  # tokens per slot: the per-request context
        self._chunk = chunk
        self._prefix_cache = prefix_cache
        self._clock = itertools.count(1)

    @property
    def busy(self) -> int:
        return sum(slot.busy for slot in self.slots)

    @property
    def free(self) -> int:
        return len(self.slots) - self.busy

    @property
    def free_tokens(self) -> int:
        """KV tokens new requests can use: the streams of the free slots (their caches give way)."""
        return self.free * self.capacity

    def reusable(self, slot: Slot, prompt: Sequence[int]) -> int:
        if not self._prefix_cache:
            return 0
        # At least one prompt token is evaluated so that fresh logits exist.
        common = min(common_prefix(slot.tokens, prompt), len(prompt) - 1)
        return (common // self._chunk) * self._chunk

    def acquire(self, prompt: Sequence[int]) -> tuple[Slot, int] | None:
        """A free slot for ``prompt`` and how many of its cached tokens to keep; None if all are busy."""
        free = [slot for slot in self.slots if not slot.busy]
        if not free:
            return None
        best = max(free, key=lambda slot: (self.reusable(slot, prompt), -slot.last_used))
        keep = self.reusable(best, prompt)
        if keep == 0:
            best = min(free, key=lambda slot: slot.last_used)
        best.busy = True
        best.last_used = next(self._clock)
        del best.tokens[keep:]
        return best, keep

    def release(self, slot: Slot) -> None:
        slot.busy = False
        slot.last_used = next(self._clock)

    def forget(self, slot: Slot) -> None:
        """The slot's KV is in an unknown state (a failed decode): cache nothing from it."""
        slot.tokens.clear()
