"""The backend capacity the worker reports in its pongs, read from the backend's Prometheus text."""

from __future__ import annotations

from oasst_worker.connection.backend_health import BackendCapacity, parse_capacity

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
