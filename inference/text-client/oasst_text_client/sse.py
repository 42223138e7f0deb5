"""A server-sent-events parser following the WHATWG "event stream interpretation" rules.

Two incremental pieces, fed by whatever chunks the transport delivers:

- ``LineSplitter`` cuts text into lines at CR, LF or CRLF only. ``str.splitlines`` (and so httpx's
  ``iter_lines``) also cuts at U+2028, U+0085 and friends, which may appear raw inside JSON data and
  would split one event line in two.
- ``SSEDecoder`` turns lines into ``ServerSentEvent`` objects: ``data`` lines joined by newlines,
  ``event``/``id``/``retry`` fields, comment lines (a leading ``:``, used for keep-alive pings) ignored,
  and an event dispatched at each blank line. An event cut off by the end of the stream is dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class ServerSentEvent:
    data: str
    event: str = "message"
    id: str | None = None
    retry_ms: int | None = None


class LineSplitter:
    def __init__(self) -> None:
        self._buffer = ""
        # A chunk that ends in CR may be followed by a chunk starting with LF: one line break, not two.
        self._pending_cr = False

    def feed(self, text: str) -> list[str]:
        if self._pending_cr and text.startswith("\n"):
            text = text[1:]
        self._pending_cr = False
        lines: list[str] = []
        start = 0
        i = 0
        n = len(text)
        while i < n:
            char = text[i]
            if char == "\n" or char == "\r":
                lines.append(self._buffer + text[start:i])
                self._buffer = ""
                if char == "\r":
                    if i + 1 == n:
                        self._pending_cr = True
                    elif text[i + 1] == "\n":
                        i += 1
                start = i + 1
            i += 1
        self._buffer += text[start:]
        return lines

    def flush(self) -> list[str]:
        """The unterminated last line, if any (it can only be part of an event that is then dropped)."""
        rest, self._buffer = self._buffer, ""
        return [rest] if rest else []


class SSEDecoder:
    def __init__(self) -> None:
        self._data: list[str] = []
        self._event = ""
        self._last_event_id: str | None = None
        self._retry_ms: int | None = None
        self._first_line = True

    @property
    def retry_ms(self) -> int | None:
        """The reconnection delay the server last asked for, if it did."""
        return self._retry_ms

    def decode(self, line: str) -> ServerSentEvent | None:
        """Feed one line (without its line break); returns an event when ``line`` completes one."""
        if self._first_line:
            self._first_line = False
            line = line.removeprefix("\ufeff")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        field, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._event = value
        elif field == "id":
            if "\0" not in value:
                self._last_event_id = value
        elif field == "retry":
            if value.isascii() and value.isdigit():
                self._retry_ms = int(value)
        # Other field names are ignored, as the specification says.
        return None

    def _dispatch(self) -> ServerSentEvent | None:
        if not self._data:
            # An event of only id/event fields dispatches nothing, but its id still counts.
            self._event = ""
            return None
        event = ServerSentEvent(
            data="\n".join(self._data),
            event=self._event or "message",
            id=self._last_event_id,
            retry_ms=self._retry_ms,
        )
        self._data = []
        self._event = ""
        return event


def iter_sse(chunks: Iterable[str]) -> Iterator[ServerSentEvent]:
    """Events from an iterable of text chunks of any size."""
    splitter = LineSplitter()
    decoder = SSEDecoder()
    for chunk in chunks:
        for line in splitter.feed(chunk):
            event = decoder.decode(line)
            if event is not None:
                yield event
    for line in splitter.flush():
        decoder.decode(line)
