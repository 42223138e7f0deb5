"""The paced benchmark (bench/paced_relay.py): its tiny mode runs the real processes and measures every path,
and the pieces it counts with (tokens in a window, the paced backend's clock) count right."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from bench.clients import StreamResult
from bench.instant_backend import InstantBackend
from bench.paced_relay import BARE, CHAT_API, OURS_V1, PASS, tokens_in
from tests.bench.test_bench_tiny import run_tiny


def test_tokens_in_a_window_are_prorated_over_the_stream():
    result = StreamResult(started=0.0, first_token=1.0, last_token=5.0, tokens=100)
    assert tokens_in(result, 0.0, 10.0) == 100  # the whole stream
    assert tokens_in(result, 3.0, 10.0) == pytest.approx(50)  # its second half
    assert tokens_in(result, 2.0, 3.0) == pytest.approx(25)
    assert tokens_in(result, 6.0, 10.0) == 0  # after it
    one = StreamResult(started=0.0, first_token=2.0, last_token=2.0, tokens=1)
    assert tokens_in(one, 1.0, 3.0) == 1 and tokens_in(one, 3.0, 4.0) == 0
    assert tokens_in(StreamResult(started=0.0), 0.0, 10.0) == 0


class VirtualClock:
    """Time that moves only when a sleeper wakes: the pacing is checked without the machine's timing."""

    def __init__(self, start: float) -> None:
        self.now = start

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        wake = self.now + seconds
        await asyncio.sleep(0)  # the other streams run meanwhile
        self.now = max(self.now, wake)


def test_paced_backend_sends_one_token_an_event_on_a_shared_clock():
    """Two streams at 4 tokens a second: each token its own body write, after the first one each at a tick
    of the clock both share (a batching model's decode steps), one tick apart."""
    tick = 1 / 4  # exact in binary: the ticks are compared exactly
    clock = VirtualClock(start=10.3)  # between ticks
    backend = InstantBackend(token_rate=1 / tick, clock=clock.time, sleep=clock.sleep)
    writes: dict[int, list[tuple[float, bytes]]] = {0: [], 1: []}

    async def stream(k: int) -> None:
        body = json.dumps({"inputs": "x", "parameters": {"max_new_tokens": 4}}).encode()
        scope = {"type": "http", "method": "POST", "path": "/generate_stream"}

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                writes[k].append((clock.time(), message["body"]))

        await backend(scope, receive, send)

    async def both() -> None:
        await asyncio.gather(stream(0), stream(1))

    asyncio.run(both())
    for k in (0, 1):
        assert [body.count(b"data:") for _, body in writes[k]] == [1, 1, 1, 1]
        later = [at for at, _ in writes[k][1:]]
        # Each later token at a tick of the shared clock, one tick after the one before.
        assert all(at % tick == 0 for at in later), later
        assert all(b - a == tick for a, b in zip(later, later[1:], strict=False)), later
    # Both streams' tokens at the same ticks: one decode step gives each stream its next token.
    assert [at for at, _ in writes[0]] == [at for at, _ in writes[1]]


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_paced_relay_tiny(tmp_path):
    report = run_tiny("paced_relay", tmp_path, timeout=300)
    assert any("LiteLLM skipped" in note for note in report["notes"])
    assert any("real model" in note and "skipped" in note for note in report["notes"])
    level = report["metrics"]["instant_20"]
    assert set(level) == {BARE, PASS, OURS_V1, CHAT_API}
    for name, path in level.items():
        assert path["errors"] == 0, f"{name}: {path['first_error']}"
        assert path["tokens"] > 0 and path["requests"] > 0
        assert path["pace"] is not None and path["pace"] > 0
    for name in (OURS_V1, CHAT_API):
        by_process = level[name]["us_per_token_by_process"]
        assert set(by_process) == {"server", "worker"}
        assert by_process["server"] > 0 and by_process["worker"] > 0
        assert level[name]["ratio_to_bare"] is not None
    targets = [t["name"] for t in report["targets"]]
    assert len(targets) == 3 and all("20 paced streams" in name for name in targets)
    # The profile of server and worker at the model's pace.
    assert any(t["title"].startswith("Profile at the model's pace: the server") for t in report["tables"])
    assert report["metrics"]["profiles"][OURS_V1]["server"]["samples"] > 0
