"""The backend capacity the worker reports in its pongs, read from the backend's Prometheus text."""

from __future__ import annotations

from aiohttp import web

from oasst_worker.connection.backend_health import BackendCapacity, BackendHealth, parse_capacity

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
    """A backend's /metrics on a real socket: the bundled backend's gauges, its reads counted."""

    def __init__(self) -> None:
        self.reads = 0
        self.kv_free = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.reads += 1
        return web.Response(text=CPU_BACKEND.replace("2048.0", f"{self.kv_free}.0"))


async def test_a_pong_after_a_job_ended_reads_the_backend_s_figures_again() -> None:
    """The figures read while every slot was busy say no KV cache is free; once a job has ended, the
    next pong reads them again rather than report them (the server would hold back the next job until
    the next poll); pongs with no job ended in between read nothing."""
    backend = CountingMetrics()
    app = web.Application()
    app.router.add_get("/metrics", backend.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    ended = [0]
    health = BackendHealth(
        None,  # type: ignore[arg-type]  # the health check itself is not used here
        interval=60,
        backend_url=f"http://127.0.0.1:{port}",
        jobs_ended=lambda: ended[0],
    )
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
        await runner.cleanup()
