"""How the Redis broker reads Redis: block times, errors, the replies of XREAD and of the fair queue's scripts."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from redis.exceptions import RedisError

from oasst_inference_server.broker.base import BrokerError, PoppedWork, StreamEntry

DATA_FIELD = "data"  # the one field of a stream entry: the event


def ms(seconds: float) -> int:
    # Never 0: a zero block time means "forever" to BLPOP and XREAD, and a zero TTL is an error.
    return max(1, math.ceil(seconds * 1000))


@contextmanager
def translated(operation: str) -> Iterator[None]:
    try:
        yield
    except (RedisError, OSError) as exc:
        raise BrokerError(f"redis {operation} failed: {type(exc).__name__}: {exc}") from exc


def unparsed(response: Any, **options: Any) -> Any:
    return response


def stream_entries(reply: Any) -> list[StreamEntry]:
    """Entries of a one-stream XREAD reply, in either RESP2 (list) or RESP3 (dict) shape, each entry's
    fields a flat list (as Redis sends them) or a dict."""
    if not reply:
        return []
    per_stream = list(reply.values()) if isinstance(reply, dict) else [item[1] for item in reply]
    entries: list[StreamEntry] = []
    for listed in per_stream:
        # redis-py's RESP3 parsing wraps the entry list of each stream in one more list.
        if listed and not _is_entry(listed[0]):
            listed = listed[0]
        for entry_id, fields in listed:
            if isinstance(fields, list) and fields and fields[0] == DATA_FIELD:
                data = fields[1]  # the one field we write
            else:
                data = _field(fields, DATA_FIELD)
            entries.append(StreamEntry(str(entry_id), str(data)))
    return entries


def _field(fields: Any, name: str) -> Any:
    if isinstance(fields, dict):
        return fields.get(name, "")
    pairs = list(fields or [])
    return next((pairs[i + 1] for i in range(0, len(pairs) - 1, 2) if pairs[i] == name), "")


def _is_entry(item: Any) -> bool:
    return isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str)


def popped_work(reply: Any) -> PoppedWork | None:
    """The reply of the fair queue's POP or WAIT script: ``[message id, job note, cost, user]`` or nil."""
    if reply is None:
        return None
    return PoppedWork(str(reply[0]), str(reply[1]))


def hand_entry(entry: Any) -> tuple[PoppedWork, float, str]:
    """A hand entry (fair_lua's PUSH): message id, job note, cost and user, joined by NULs."""
    message_id, job, cost, user = str(entry).split("\0")
    return PoppedWork(message_id, job), float(cost), user


def handed_work(entry: Any) -> PoppedWork:
    return hand_entry(entry)[0]
