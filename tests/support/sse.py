"""Server-sent events read off a response's lines, for tests that read a stream without a client library."""

from __future__ import annotations

from collections.abc import Iterable, Iterator


def sse_events(lines: Iterable[str]) -> Iterator[tuple[str | None, str]]:
    """(id, data) of each event among ``lines`` (comments and other fields skipped; an event's data lines
    joined by newlines), an event without its closing blank line at the end included."""
    event_id: str | None = None
    data: list[str] = []
    for line in lines:
        if line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
        elif line == "" and data:
            yield event_id, "\n".join(data)
            event_id, data = None, []
    if data:
        yield event_id, "\n".join(data)
