"""The cosine similarity of two embedding vectors (rerank and score)."""

from __future__ import annotations

import math


def cosine(a: list[float], b: list[float]) -> float:
    """In [-1, 1]; 0 when either vector is all zeros (or they differ in length: no meaningful answer)."""
    if len(a) != len(b):
        return 0.0
    norms = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    if norms == 0.0:
        return 0.0
    return max(-1.0, min(1.0, math.fsum(x * y for x, y in zip(a, b, strict=True)) / norms))
