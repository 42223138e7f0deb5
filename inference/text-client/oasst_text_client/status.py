"""A transient one-line status (queue position) on a terminal, erased before real output."""

from __future__ import annotations

from typing import TextIO

_ERASE_LINE = "\r\x1b[2K"


class StatusLine:
    def __init__(self, stream: TextIO, enabled: bool | None = None) -> None:
        self._stream = stream
        # On a file or a pipe a status that is rewritten in place would only be clutter.
        self._enabled = _isatty(stream) if enabled is None else enabled
        self._shown = False

    def show(self, text: str) -> None:
        if not self._enabled:
            return
        self._stream.write(f"{_ERASE_LINE}{text}")
        self._stream.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            self._stream.write(_ERASE_LINE)
            self._stream.flush()
            self._shown = False


def queue_text(queue_position: int, queue_size: int) -> str:
    return f"[waiting in queue: position {queue_position} of {queue_size}]"


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
