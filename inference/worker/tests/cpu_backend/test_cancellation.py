"""A client that goes away stops its generation and frees the model; limits answer 429/503 and time out.

The timeouts in here only bound a hang; no assertion is about speed.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from text_generation import AsyncClient, Client
from text_generation.errors import IncompleteGenerationError, OverloadedError

from .conftest import COUNTING_PROMPT, RunningBackend, start_backend, stop_backend

pytestmark = pytest.mark.slow

TIMEOUT = 120
# Far more tokens than the tests wait for: only a working cancel ends these generations early.
LONG = 1900

CANCELLED = "oasst_cpu_backend_cancellations_total"


async def test_closing_a_stream_stops_the_generation(backend: RunningBackend) -> None:
    cancelled_before = backend.metric(CANCELLED)
    tokens_before = backend.metric("oasst_cpu_backend_generated_tokens_total")
    stream = AsyncClient(backend.url, timeout=TIMEOUT).generate_stream(COUNTING_PROMPT, max_new_tokens=LONG)
    seen = 0
    async for event in stream:
        assert event.details is None
        seen += 1
        if seen == 3:
            break
    await stream.aclose()  # what the worker does on cancel: the HTTP connection closes

    backend.wait_until(lambda: backend.metric(CANCELLED) == cancelled_before + 1)
    stopped_after = backend.cancelled_token_counts()[-1]
    assert seen <= stopped_after < LONG
    assert backend.metric("oasst_cpu_backend_generated_tokens_total") - tokens_before == stopped_after
    assert backend.metric("oasst_cpu_backend_running") == 0

    # The model is free again: the next request is served in full.
    response = await AsyncClient(backend.url, timeout=TIMEOUT).generate(COUNTING_PROMPT, max_new_tokens=5)
    assert response.details.generated_tokens == 5


def test_a_client_timing_out_on_generate_stops_the_generation(backend: RunningBackend) -> None:
    cancelled_before = backend.metric(CANCELLED)
    body = {"inputs": COUNTING_PROMPT, "parameters": {"max_new_tokens": LONG}}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{backend.url}/generate", json=body, timeout=httpx.Timeout(TIMEOUT, read=0.5))
    backend.wait_until(lambda: backend.metric(CANCELLED) == cancelled_before + 1)
    assert backend.cancelled_token_counts()[-1] < LONG
    assert (
        Client(backend.url, timeout=TIMEOUT)
        .generate(COUNTING_PROMPT, max_new_tokens=3)
        .details.generated_tokens
        == 3
    )


@pytest.fixture(scope="module")
def single_slot_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBackend]:
    """One sequence at a time: a second request waits in the queue."""
    running = start_backend(tmp_path_factory.mktemp("single-slot"), OASST_CPU_BACKEND_PARALLEL_SEQUENCES="1")
    try:
        yield running
    finally:
        stop_backend(running)


async def test_a_request_abandoned_in_the_queue_never_runs(single_slot_backend: RunningBackend) -> None:
    backend = single_slot_backend
    cancelled_before = backend.metric(CANCELLED)
    first = AsyncClient(backend.url, timeout=TIMEOUT).generate_stream(COUNTING_PROMPT, max_new_tokens=LONG)
    await first.__anext__()  # the first request holds the model

    async def queued() -> None:
        await AsyncClient(backend.url, timeout=TIMEOUT).generate(COUNTING_PROMPT, max_new_tokens=LONG)

    waiting = asyncio.create_task(queued())
    await asyncio.to_thread(backend.wait_until, lambda: backend.metric("oasst_cpu_backend_queue_size") == 1)
    waiting.cancel()  # closes its connection while it waits
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await first.aclose()

    await asyncio.to_thread(backend.wait_until, lambda: backend.metric(CANCELLED) == cancelled_before + 2)
    counts = backend.cancelled_token_counts()[-2:]
    assert 0 in counts  # the queued one generated nothing
    assert backend.metric("oasst_cpu_backend_queue_size") == 0


@pytest.fixture(scope="module")
def limited_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBackend]:
    """One request generating and one waiting at most; short queue and request timeouts."""
    log_dir: Path = tmp_path_factory.mktemp("limited-backend")
    running = start_backend(
        log_dir,
        OASST_CPU_BACKEND_MAX_CONCURRENT_REQUESTS="2",
        OASST_CPU_BACKEND_PARALLEL_SEQUENCES="1",
        OASST_CPU_BACKEND_QUEUE_TIMEOUT="1",
        OASST_CPU_BACKEND_REQUEST_TIMEOUT="4",
    )
    try:
        yield running
    finally:
        stop_backend(running)


async def test_overload_queue_timeout_and_request_timeout(limited_backend: RunningBackend) -> None:
    backend = limited_backend
    url = backend.url
    # A runs until request_timeout stops it: the client then raises IncompleteGenerationError.
    stream_a = AsyncClient(url, timeout=TIMEOUT).generate_stream(COUNTING_PROMPT, max_new_tokens=LONG)
    first = await stream_a.__anext__()
    assert first.details is None

    async def generate_b() -> None:
        await AsyncClient(url, timeout=TIMEOUT).generate(COUNTING_PROMPT, max_new_tokens=5)

    # B waits for the model; C finds no room at all: 429.
    waiting_b = asyncio.create_task(generate_b())
    await asyncio.to_thread(backend.wait_until, lambda: backend.metric("oasst_cpu_backend_queue_size") == 1)
    with pytest.raises(OverloadedError):
        await AsyncClient(url, timeout=TIMEOUT).generate(COUNTING_PROMPT, max_new_tokens=5)
    raw = httpx.post(url, json={"inputs": COUNTING_PROMPT}, timeout=TIMEOUT)
    assert raw.status_code == 429 and raw.json()["error_type"] == "overloaded"
    assert raw.headers["retry-after"]

    # B gives up after queue_timeout with 503 overloaded.
    with pytest.raises(OverloadedError, match="queue_timeout"):
        await waiting_b

    # A streamed queued stream D also gets "overloaded", as an error event of its stream.
    with pytest.raises(OverloadedError, match="queue_timeout"):
        async for _ in AsyncClient(url, timeout=TIMEOUT).generate_stream(COUNTING_PROMPT, max_new_tokens=5):
            pass

    received = 1
    with pytest.raises(IncompleteGenerationError, match="request_timeout"):
        async for event in stream_a:
            assert event.details is None
            received += 1
    assert received < LONG

    # The expired tickets are counted once they pass the generation thread, right after A.
    await asyncio.to_thread(
        backend.wait_until,
        lambda: backend.metric('oasst_cpu_backend_requests_total{outcome="queue_timeout"}') == 2,
    )
    metrics = backend.metrics()
    assert metrics['oasst_cpu_backend_requests_total{outcome="overloaded"}'] == 2
    assert metrics['oasst_cpu_backend_requests_total{outcome="timeout"}'] == 1
    assert metrics.get(CANCELLED, 0) == 0
    assert metrics["oasst_cpu_backend_queue_size"] == 0
    # And the model serves again afterwards.
    after = await AsyncClient(url, timeout=TIMEOUT).generate(COUNTING_PROMPT, max_new_tokens=4)
    assert after.details.generated_tokens == 4


async def test_sigterm_ends_streams_with_an_error_and_exits_cleanly(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    running = start_backend(tmp_path_factory.mktemp("sigterm-backend"))
    try:
        stream = AsyncClient(running.url, timeout=TIMEOUT).generate_stream(
            COUNTING_PROMPT, max_new_tokens=LONG
        )
        await stream.__anext__()
        running.proc.send_signal(signal.SIGTERM)
        received = 1
        # The worker can tell this from a finished answer and retry elsewhere.
        with pytest.raises(IncompleteGenerationError, match="shutting down"):
            async for _ in stream:
                received += 1
        assert received < LONG
        returncode = await asyncio.to_thread(running.proc.wait, TIMEOUT)
    finally:
        stop_backend(running)
    assert returncode in (0, -signal.SIGTERM)
    log = running.log()
    assert "cancelled after" in log and "server shutting down" in log
    assert "Traceback" not in log and "graceful shutdown exceeded" not in log
