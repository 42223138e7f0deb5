"""Whole tokens held back while their text may belong to a stop sequence (the text rule itself is
oasst_shared.stop_sequences.StopSequenceFilter, shared with the worker)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from oasst_shared.stop_sequences import StopSequenceFilter

T = TypeVar("T")


@dataclass
class _Pending(Generic[T]):
    item: T
    remaining: int
    released: list[str] = field(default_factory=list)


class TokenHoldback(Generic[T]):
    """Holds back whole tokens while their text might belong to a stop sequence.

    Each pushed item (a generated token) is released with the part of its text that is final; items
    leave in the order they came. When a stop sequence completes, every held item is released with the
    text it contributes before the stop sequence (possibly ""), so the number of tokens stays honest.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._filter = StopSequenceFilter(stops)
        self._pending: deque[_Pending[T]] = deque()
        self._text: list[str] = []

    @property
    def stopped(self) -> bool:
        return self._filter.matched is not None

    @property
    def text(self) -> str:
        """All text released so far."""
        return "".join(self._text)

    def push(self, item: T, text: str, *, is_text: bool = True) -> list[tuple[T, str]]:
        """Add a token. Items with is_text=False (special tokens) keep their place in the order but their
        text is not part of the generated text and is never matched against stop sequences."""
        if self.stopped:
            raise RuntimeError("a stop sequence already ended this generation")
        if not is_text:
            self._pending.append(_Pending(item, 0, [text]))
            return self._release_ready()
        self._pending.append(_Pending(item, len(text)))
        self._distribute(self._filter.push(text))
        if self.stopped:
            return self._release_all()
        return self._release_ready()

    def finish(self) -> list[tuple[T, str]]:
        """The generation ended without a stop sequence: release everything."""
        if not self.stopped:
            self._distribute(self._filter.flush())
        return self._release_all()

    def _distribute(self, released: str) -> None:
        self._text.append(released)
        for pending in self._pending:
            if not released:
                break
            if pending.remaining == 0:
                continue
            part = released[: pending.remaining]
            pending.released.append(part)
            pending.remaining -= len(part)
            released = released[len(part) :]

    def _release_ready(self) -> list[tuple[T, str]]:
        out: list[tuple[T, str]] = []
        while self._pending and self._pending[0].remaining == 0:
            pending = self._pending.popleft()
            out.append((pending.item, "".join(pending.released)))
        return out

    def _release_all(self) -> list[tuple[T, str]]:
        out = [(p.item, "".join(p.released)) for p in self._pending]
        self._pending.clear()
        return out
