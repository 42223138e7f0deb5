"""Redis key names of the broker, and the stream id format both brokers share.

Every key and pub/sub channel lives under one prefix so several deployments (or test runs) can share a
Redis without seeing each other. Pub/sub channels ignore the database number, so the prefix is the only
thing that separates them.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_STREAM_ID = re.compile(r"(\d{1,20})(?:-(\d{1,20}))?")
_U64_MAX = 2**64 - 1


class StreamId(NamedTuple):
    """A Redis stream entry id, ``<milliseconds>-<sequence>``; tuples order the same way Redis does."""

    ms: int
    seq: int

    def __str__(self) -> str:
        return f"{self.ms}-{self.seq}"


def parse_stream_id(value: str) -> StreamId:
    """Parse ``<ms>-<seq>`` (or ``<ms>``, meaning ``<ms>-0`` as in XREAD); ValueError if malformed.

    Callers pass client-supplied Last-Event-ID values here, so anything Redis would reject with an
    error (or interpret specially, like ``$``) is refused up front.
    """
    match = _STREAM_ID.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"not a stream id: {value!r}")
    ms, seq = int(match.group(1)), int(match.group(2) or 0)
    if ms > _U64_MAX or seq > _U64_MAX:
        raise ValueError(f"stream id out of range: {value!r}")
    return StreamId(ms, seq)


def is_stream_id(value: str) -> bool:
    try:
        parse_stream_id(value)
    except ValueError:
        return False
    return True


def stream_id_after(a: str, b: str) -> bool:
    """True when stream id ``a`` comes strictly after ``b`` (string comparison gets this wrong)."""
    return parse_stream_id(a) > parse_stream_id(b)


class RedisKeys:
    """The names of everything the Redis broker stores."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def queue(self, name: str) -> str:
        """The base name of a fair queue's keys (see :mod:`.fair_lua`)."""
        return f"{self.prefix}queue:{name}:"

    def stream(self, name: str) -> str:
        return f"{self.prefix}stream:{name}"

    def session(self, session_id: str) -> str:
        return f"{self.prefix}session:{session_id}"

    @property
    def session_index(self) -> str:
        # A sorted set of session ids scored by expiry (ms): SCAN over session keys would cost O(keyspace).
        return f"{self.prefix}sessions"

    def lock(self, name: str) -> str:
        return f"{self.prefix}lock:{name}"

    def slots(self, name: str) -> str:
        # A sorted set: holder -> expiry (ms of Redis' clock).
        return f"{self.prefix}slots:{name}"

    def counter(self, name: str) -> str:
        """A usage counter (:mod:`.counters`)."""
        return f"{self.prefix}counter:{name}"

    def channel(self, name: str) -> str:
        return f"{self.prefix}command:{name}"

    @property
    def pattern(self) -> str:
        """A SCAN MATCH pattern covering every key of this prefix (for cleanup tools and tests)."""
        return _glob_escape(self.prefix) + "*"


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)
