"""Hold back streamed text that may be the start of a stop sequence.

Text is released only once it cannot be part of a stop sequence, so a reader never sees text that is
later retracted, and the text ends right before the stop sequence (which is not included). Used by the
worker on every backend's stream and by the bundled CPU backend.
"""

from __future__ import annotations

from collections.abc import Iterable


class StopSequenceFilter:
    def __init__(self, stop_sequences: Iterable[str]):
        self._stops = [s for s in dict.fromkeys(stop_sequences) if s]
        self._held = ""
        self.matched: str | None = None

    @property
    def stopped(self) -> bool:
        return self.matched is not None

    @property
    def held(self) -> str:
        return self._held

    def push(self, text: str) -> str:
        """Add streamed text; return the part that is safe to show now."""
        if self.matched is not None or not text:
            return ""
        if not self._stops:
            return text
        buffer = self._held + text
        first: tuple[int, str] | None = None
        for stop in self._stops:
            position = buffer.find(stop)
            if position >= 0 and (first is None or position < first[0]):
                first = (position, stop)
        if first is not None:
            self.matched = first[1]
            self._held = ""
            return buffer[: first[0]]
        hold = self._longest_partial_match(buffer)
        self._held = buffer[len(buffer) - hold :]
        return buffer[: len(buffer) - hold]

    def flush(self) -> str:
        """The held-back text, once the stream ended without completing a stop sequence."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _longest_partial_match(self, buffer: str) -> int:
        """Length of the longest suffix of buffer that is a proper prefix of some stop sequence."""
        best = 0
        for stop in self._stops:
            for length in range(min(len(stop) - 1, len(buffer)), best, -1):
                if buffer.endswith(stop[:length]):
                    best = length
                    break
        return best
