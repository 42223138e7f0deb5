"""The SSE ids of a resumable ``/v1`` stream: where each chunk stands in its message's event stream.

Every chunk of a streamed chat completion or completion carries ``id: <completion id>/<position>``. The
position is the broker entry of the event the chunk was made from, so it means the same on every
replica (the events live in the broker):

* ``0``: the opening chunk (the assistant role), before any event;
* ``<entry>``: the first (usually only) chunk of the event stored as ``<entry>`` (a token);
* ``<entry>.<k>``: its ``k``-th further chunk (an answer's end is several: tool calls, the finish
  reason, the usage, ``[DONE]``).

A reconnecting client sends the last id it saw as ``Last-Event-ID``; the stream is rendered again from
its first event (so every chunk is the same as the first time) and the chunks up to that position are
skipped: the rest follows with no gap and no duplicate.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from oasst_inference_server.broker.keys import StreamId, parse_stream_id
from oasst_inference_server.domain_errors import InvalidRequest

MAX_EVENT_ID_CHARS = 200  # a longer Last-Event-ID is refused before it is parsed
_COMPLETION_ID = re.compile(r"(chatcmpl|cmpl)-([0-9a-f-]{1,36})")


class Position(NamedTuple):
    """A chunk's place: the broker entry it came from, then its index among that entry's chunks."""

    entry: StreamId
    part: int

    def wire(self) -> str:
        if self.entry == OPENING.entry:
            return "0"
        return str(self.entry) if self.part == 0 else f"{self.entry}.{self.part}"


OPENING = Position(StreamId(0, 0), 0)


def parse_completion_id(completion_id: str, prefix: str) -> str:
    """The message id of ``<prefix>-<message id>``; ``InvalidRequest`` for anything else."""
    match = _COMPLETION_ID.fullmatch(completion_id) if len(completion_id) <= 64 else None
    if match is None or match.group(1) != prefix:
        raise InvalidRequest(
            "invalid_completion_id",
            f"{completion_id[:64]!r} is not the id of a streamed {prefix} response",
            param="id",
        )
    return match.group(2)


def parse_last_event_id(last_event_id: str, completion_id: str) -> Position:
    """The position of ``<completion id>/<position>``; ``InvalidRequest`` if it is malformed or names
    another completion."""
    head, _, position = last_event_id.strip().rpartition("/")
    if len(last_event_id) > MAX_EVENT_ID_CHARS or head != completion_id:
        raise InvalidRequest(
            "invalid_last_event_id",
            f"Last-Event-ID {last_event_id[:80]!r} is not an event id of {completion_id}",
            param="Last-Event-ID",
        )
    try:
        return parse_position(position)
    except ValueError:
        raise InvalidRequest(
            "invalid_last_event_id",
            f"Last-Event-ID {last_event_id[:80]!r} names no position in the stream",
            param="Last-Event-ID",
        ) from None


def parse_position(text: str) -> Position:
    """``0``, ``<entry>`` or ``<entry>.<k>`` (ValueError otherwise)."""
    if text == "0":
        return OPENING
    entry, dot, part = text.partition(".")
    if dot and not (part.isdigit() and len(part) <= 6 and int(part) > 0):
        raise ValueError(f"not a chunk index: {part!r}")
    stream_id = parse_stream_id(entry)
    if stream_id == OPENING.entry:
        raise ValueError("entry 0 is the opening chunk")
    return Position(stream_id, int(part) if dot else 0)


class ChunkIds:
    """Frames a stream's chunks with their ids, and drops those a resuming client already has."""

    def __init__(self, completion_id: str, after: Position | None) -> None:
        self._prefix = f"id: {completion_id}/"
        self._after = after

    def frame(self, entry_id: str | None, chunks: list[str]) -> list[str]:
        """``chunks`` made from the event stored as ``entry_id`` (None: an event that was not stored,
        whose chunks carry no id), each with its id, without those at or before the resume point."""
        if entry_id is None:
            return chunks
        after = self._after
        if after is not None:
            entry = parse_stream_id(entry_id)
            if entry < after.entry:
                return []
            if entry == after.entry:
                return [self._framed(entry_id, part, c) for part, c in enumerate(chunks) if part > after.part]
        return [self._framed(entry_id, part, chunk) for part, chunk in enumerate(chunks)]

    def one(self, entry_id: str, chunk: str) -> str | None:
        """A single chunk of an event (the hot path: a token)."""
        return f"{self._prefix}{entry_id}\n{chunk}" if self.is_new(entry_id) else None

    def is_new(self, entry_id: str) -> bool:
        """Whether the client has not seen the (first) chunk of the event stored as ``entry_id``."""
        after = self._after
        return after is None or parse_stream_id(entry_id) > after.entry

    def opening(self, chunk: str) -> str | None:
        return None if self._after is not None else f"{self._prefix}0\n{chunk}"

    def _framed(self, entry_id: str, part: int, chunk: str) -> str:
        return f"{self._prefix}{entry_id}{'.' + str(part) if part else ''}\n{chunk}"
