"""Prometheus metrics on the server and the worker move after a generation."""

from __future__ import annotations

import re
import uuid

import httpx
import pytest

from tests.e2e.chat_api import ChatApi
from tests.support.processes import free_port, wait_for_model
from tests.support.stacks import start_stack

pytestmark = pytest.mark.slow


def sample(text: str, name: str, default: float | None = None, **labels: str) -> float:
    """The value of one sample in Prometheus exposition text; a missing one fails the test unless a
    ``default`` is given (for baselines taken before the first event)."""
    pattern = rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$"
    total, found = 0.0, False
    for match in re.finditer(pattern, text, re.MULTILINE):
        if not labels or all(f'{k}="{v}"' in (match.group(1) or "") for k, v in labels.items()):
            total += float(match.group(2))
            found = True
    if not found:
        assert default is not None, f"{name} {labels} is not exported"
        return default
    return total


def test_metrics_move_after_a_generation(cpu_backend, tmp_path):
    stack = start_stack(tmp_path, cpu_backend.url, f"sqlite+aiosqlite:///{tmp_path}/m.db", None, workers=0)
    try:
        metrics_port = free_port()
        stack.start_worker(OASST_WORKER_METRICS_PORT=str(metrics_port))
        wait_for_model(stack.url, stack.model_name)
        server_before = httpx.get(f"{stack.url}/metrics").text
        worker_before = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
        model = stack.model_name
        assert sample(server_before, "oasst_server_workers_connected", model=model) == 1

        api = ChatApi(stack.url, f"user-{uuid.uuid4().hex[:8]}")
        _, events = api.ask(api.create_chat(), "Say hello.", model, do_sample=False, max_new_tokens=8)
        assert events[-1].data["event_type"] == "message"
        tokens = sum(e.data["event_type"] == "token" for e in events)

        server = httpx.get(f"{stack.url}/metrics").text
        for name in ("oasst_server_dispatched_total", "oasst_server_time_to_first_token_seconds_count"):
            before = sample(server_before, name, default=0.0, model=model)
            assert sample(server, name, model=model) == before + 1, name
        assert sample(server, "oasst_server_tokens_relayed_total", model=model) >= tokens
        assert sample(server, "oasst_server_messages_finished_total", model=model, state="complete") == 1
        assert sample(server, "oasst_server_tokens_per_second_count", model=model) == 1
        assert sample(server, "oasst_server_in_flight_generations", model=model) == 0

        worker = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
        assert sample(worker, "oasst_worker_jobs_total", outcome="complete") == 1
        assert sample(worker, "oasst_worker_tokens_generated_total") > sample(
            worker_before, "oasst_worker_tokens_generated_total", default=0.0
        )
        assert sample(worker, "oasst_worker_time_to_first_token_seconds_count") == 1
        assert sample(worker, "oasst_worker_backend_healthy") == 1
    finally:
        stack.stop()
