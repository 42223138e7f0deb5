"""create_broker and the stream id helpers."""

from __future__ import annotations

import pytest

from oasst_inference_server.broker import (
    InMemoryBroker,
    RedisBroker,
    StreamId,
    create_broker,
    is_stream_id,
    parse_stream_id,
    stream_id_after,
)


@pytest.mark.parametrize("url", [None, "", "memory://"])
def test_memory_urls(url: str | None) -> None:
    broker = create_broker(url, stream_ttl=5, stream_maxlen=50)
    assert isinstance(broker, InMemoryBroker)
    assert (broker.stream_ttl, broker.stream_maxlen) == (5, 50)


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "rediss://h:6380/1", "unix:///tmp/redis.sock"])
def test_redis_urls(url: str) -> None:
    broker = create_broker(url, key_prefix="x:", stream_ttl=5, stream_maxlen=50)
    assert isinstance(broker, RedisBroker)
    assert broker.keys.prefix == "x:"
    assert (broker.stream_ttl, broker.stream_maxlen) == (5, 50)


@pytest.mark.parametrize("url", ["http://localhost", "postgres://x", "localhost:6379"])
def test_unknown_scheme_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="memory://"):
        create_broker(url)


def test_stream_ids() -> None:
    assert parse_stream_id("1700000000000-5") == StreamId(1700000000000, 5)
    assert parse_stream_id("12") == StreamId(12, 0)
    assert str(StreamId(3, 4)) == "3-4"
    # The comparison string order gets wrong: a shorter millisecond part, or a sequence of 10 vs 9.
    assert stream_id_after("10-0", "9-0")
    assert stream_id_after("5-10", "5-9")
    assert not stream_id_after("5-9", "5-9")
    assert is_stream_id("0-0")
    assert not is_stream_id("$")
    with pytest.raises(ValueError):
        parse_stream_id("18446744073709551616-0")
