"""Hold back streamed text that may be the start of a stop sequence, so it is never shown then retracted."""

from __future__ import annotations

from collections.abc import Iterable


class StopSequenceFilter:
    def __init__(self, stop_sequences: Iterable[str]):
        self._stops = [s for s in dict.fromkeys(stop_sequences) if s]
        self._held = ""
        self.stopped = False

    def push(self, text: str) -> str:
        """Add streamed text; return the part that is safe to show now."""
        if self.stopped or not text:
            return ""
        if not self._stops:
            return text
        buffer = self._held + text
        cut = min((i for i in (buffer.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return buffer[:cut]
        hold = self._longest_stop_prefix_suffix(buffer)
        self._held = buffer[len(buffer) - hold :] if hold else ""
        return buffer[: len(buffer) - hold]

    def flush(self) -> str:
        """The held-back text, once the stream ended without completing a stop sequence."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _longest_stop_prefix_suffix(self, buffer: str) -> int:
        best = 0
        for stop in self._stops:
            for length in range(min(len(stop) - 1, len(buffer)), best, -1):
                if buffer.endswith(stop[:length]):
                    best = length
                    break
        return best
