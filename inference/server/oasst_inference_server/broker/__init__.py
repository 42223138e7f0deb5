"""The broker (work queues, event streams, worker sessions, commands, locks); see :mod:`.base`.

May import settings, errors, logging_setup; not db or anything above.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from oasst_inference_server.broker.base import (
    Broker,
    BrokerError,
    PoppedWork,
    StreamEntry,
    StreamsReader,
    WorkerSessionRecord,
)
from oasst_inference_server.broker.fair import QueuedHint, QueueSnapshot, dispatch_order
from oasst_inference_server.broker.keys import StreamId, is_stream_id, parse_stream_id, stream_id_after
from oasst_inference_server.broker.memory import InMemoryBroker
from oasst_inference_server.broker.redis import RedisBroker
from oasst_inference_server.broker.worker_session import WorkerSession

_REDIS_SCHEMES = ("redis", "rediss", "unix")


def create_broker(
    url: str | None,
    *,
    key_prefix: str = "oasst:",
    stream_ttl: float = 600.0,
    stream_maxlen: int = 10000,
    max_connections: int = 512,
    stream_idle_ttl: float = 3600.0,
    fair_credit: float = 0.0,
) -> Broker:
    """The broker a URL names: None or ``memory://`` -> in-process; ``redis://``, ``rediss://``,
    ``unix://`` -> Redis. The caller still has to ``await broker.start()``."""
    if url is None or not url.strip() or url.strip() == "memory://":
        return InMemoryBroker(
            stream_ttl=stream_ttl,
            stream_maxlen=stream_maxlen,
            stream_idle_ttl=stream_idle_ttl,
            fair_credit=fair_credit,
        )
    scheme = urlsplit(url.strip()).scheme.lower()
    if scheme in _REDIS_SCHEMES:
        return RedisBroker(
            url.strip(),
            key_prefix=key_prefix,
            stream_ttl=stream_ttl,
            stream_maxlen=stream_maxlen,
            max_connections=max_connections,
            stream_idle_ttl=stream_idle_ttl,
            fair_credit=fair_credit,
        )
    raise ValueError(
        f"unsupported broker URL scheme {scheme!r}: use memory:// or one of "
        + ", ".join(f"{s}://" for s in _REDIS_SCHEMES)
    )


__all__ = [
    "Broker",
    "BrokerError",
    "InMemoryBroker",
    "PoppedWork",
    "QueueSnapshot",
    "QueuedHint",
    "RedisBroker",
    "StreamEntry",
    "StreamId",
    "StreamsReader",
    "WorkerSession",
    "WorkerSessionRecord",
    "create_broker",
    "dispatch_order",
    "is_stream_id",
    "parse_stream_id",
    "stream_id_after",
]
