"""The backend capacity the worker reports in its pongs, read from the backend's Prometheus text, on one
connection for all the reads, closed when the worker stops."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from oasst_shared.model_configs import SMOLLM2_135M
from oasst_worker.connection.backend_health import BackendCapacity, BackendHealth, parse_capacity
from oasst_worker.connection.client import WorkerClient
from oasst_worker.jobs.generation import GenerationJobFactory
from oasst_worker.settings import WorkerSettings
from tests.support.worker_jobs import OneToken

TGI = """# TYPE tgi_queue_size gauge
tgi_queue_size 3
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 5
"""

VLLM = """# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 7.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.25
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="1000",model_name="m"} 1.0
"""

CPU_BACKEND = """# TYPE oasst_cpu_backend_queue_size gauge
oasst_cpu_backend_queue_size 1.0
# TYPE oasst_cpu_backend_kv_cache_free_tokens gauge
oasst_cpu_backend_kv_cache_free_tokens 2048.0
"""


def test_tgi_vllm_and_the_bundled_backend() -> None:
    assert parse_capacity(TGI) == BackendCapacity(queue_length=3, kv_cache_free_tokens=None)
    assert parse_capacity(VLLM) == BackendCapacity(queue_length=7, kv_cache_free_tokens=12000)
    assert parse_capacity(CPU_BACKEND) == BackendCapacity(queue_length=1, kv_cache_free_tokens=2048)


def test_unknown_or_broken_text_reports_nothing() -> None:
    assert parse_capacity("") == BackendCapacity()
    assert parse_capacity("something_else 1\n") == BackendCapacity()
    assert parse_capacity("{{{ not prometheus") == BackendCapacity()


class CountingMetrics:
    """A backend's /metrics on a real socket: the bundled backend's gauges, its reads and the connections
    they came on counted."""

    def __init__(self) -> None:
        self.reads = 0
        self.kv_free = 0
        self.peers: set[tuple[str, int]] = set()  # the client end of every connection a read came on
        self.url = ""
        self.runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        self.reads += 1
        assert request.transport is not None
        self.peers.add(request.transport.get_extra_info("peername"))
        return web.Response(text=CPU_BACKEND.replace("2048.0", f"{self.kv_free}.0"))

    async def connections_closed(self) -> bool:
        """Whether every connection to it has been closed (waits a little for the client's close)."""
        assert self.runner is not None and self.runner.server is not None
        for _ in range(100):
            if not self.runner.server.connections:
                return True
            await asyncio.sleep(0.02)
        return False


@contextlib.asynccontextmanager
async def metrics_server() -> AsyncIterator[CountingMetrics]:
    backend = CountingMetrics()
    app = web.Application()
    app.router.add_get("/metrics", backend.handle)
    backend.runner = web.AppRunner(app)
    await backend.runner.setup()
    site = web.TCPSite(backend.runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    backend.url = f"http://127.0.0.1:{port}"
    try:
        yield backend
    finally:
        await backend.runner.cleanup()


def health_of(url: str, ended: list[int]) -> BackendHealth:
    """A ``BackendHealth`` of the backend at ``url`` (only its /metrics reads are used here), whose
    connection has ended ``ended[0]`` jobs."""
    return BackendHealth(
        None,  # type: ignore[arg-type]  # the health check itself is not used here
        interval=60,
        backend_url=url,
        jobs_ended=lambda: ended[0],
    )


async def test_a_pong_after_a_job_ended_reads_the_backend_s_figures_again() -> None:
    """The figures read while every slot was busy say no KV cache is free; once a job has ended, the
    next pong reads them again rather than report them (the server would hold back the next job until
    the next poll); pongs with no job ended in between read nothing."""
    ended = [0]
    async with metrics_server() as backend:
        health = health_of(backend.url, ended)
        try:
            await health._read_capacity()  # the poll, every slot busy
            assert health.capacity.kv_cache_free_tokens == 0 and backend.reads == 1
            assert (await health.capacity_for_pong()).kv_cache_free_tokens == 0
            assert backend.reads == 1  # nothing ended: the poll's figures
            backend.kv_free, ended[0] = 2048, 1  # a job ends, its slot's stream is free
            assert (await health.capacity_for_pong()).kv_cache_free_tokens == 2048
            assert backend.reads == 2
            assert (await health.capacity_for_pong()).kv_cache_free_tokens == 2048
            assert backend.reads == 2
        finally:
            await health.close()


async def test_the_reads_share_one_connection_closed_by_close() -> None:
    """A poll, a pong after each of two job ends, another poll: four reads on one connection (each used to
    open its own); close() closes it, and nothing is read after."""
    ended = [0]
    async with metrics_server() as backend:
        health = health_of(backend.url, ended)
        await health._read_capacity()
        for _ in range(2):
            ended[0] += 1
            await health.capacity_for_pong()
        await health._read_capacity()
        assert backend.reads == 4 and len(backend.peers) == 1, backend.peers
        await health.close()
        assert await backend.connections_closed()
        ended[0] += 1
        await health.capacity_for_pong()
        assert backend.reads == 4


async def test_the_worker_closes_the_metrics_connection_when_it_stops() -> None:
    """A worker whose server is unreachable keeps polling its backend (on one connection) until it
    stops, and closes that connection then."""
    async with metrics_server() as backend:
        settings = WorkerSettings(
            server_url="ws://127.0.0.1:9",  # nothing listens: the worker retries until it stops
            backend_url=backend.url,
            backend_health_interval=0.02,
            reconnect_min_delay=0.02,
            reconnect_max_delay=0.05,
        )
        config = SMOLLM2_135M.model_copy(update={"chat_template_source": "chatml"})
        client = WorkerClient(settings, GenerationJobFactory(OneToken(), config))
        running = asyncio.create_task(client.run())
        try:
            for _ in range(250):
                if backend.reads >= 3:
                    break
                await asyncio.sleep(0.02)
            assert backend.reads >= 3 and len(backend.peers) == 1, backend.peers
            assert backend.runner is not None and backend.runner.server is not None
            assert backend.runner.server.connections  # open between the polls
            await client.drain()
            await asyncio.wait_for(running, 10)
        finally:
            running.cancel()
        assert await backend.connections_closed()
