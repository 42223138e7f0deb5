"""Fixtures for fault injection: a stack with fast timeouts on Postgres + Redis, and the fake backend."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from conftest import (
    REDIS_URL,
    Backend,
    ManagedProcess,
    Stack,
    free_port,
    fresh_database,
    start_stack,
    wait_for_model,
    wait_http_ok,
)
from oasst_shared.model_configs import ModelConfig

FAST_TIMINGS = {
    "OASST_SERVER_WORKER_PING_INTERVAL": "0.5",
    "OASST_SERVER_WORKER_PING_TIMEOUT": "2",
    "OASST_SERVER_LEASE_SECONDS": "4",
    "OASST_SERVER_RECOVERY_INTERVAL": "0.5",
    "OASST_SERVER_REQUEUE_GRACE": "1",
    # Long enough for a worker process to start on a loaded machine (the tests start them late on purpose).
    "OASST_SERVER_NO_WORKER_TIMEOUT": "10",
    "OASST_SERVER_MAX_ATTEMPTS": "3",
    "OASST_SERVER_PENDING_UPDATE_INTERVAL": "0.3",
    "OASST_SERVER_MAX_BACKEND_REFUSALS": "2",
}


@dataclass
class FakeBackend:
    url: str
    process: ManagedProcess

    def stats(self) -> dict[str, int]:
        return dict(httpx.get(f"{self.url}/stats", timeout=5).json())


@pytest.fixture(scope="module")
def fake_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeBackend]:
    import subprocess

    port = free_port()
    log_dir = tmp_path_factory.mktemp("fake-backend")
    log = (log_dir / "fake.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "fake_backend.py"), str(port)], stdout=log, stderr=log
    )
    process = ManagedProcess("fake-backend", proc, log_dir / "fake.log")
    url = f"http://127.0.0.1:{port}"
    wait_http_ok(f"{url}/health", process, timeout=30)
    yield FakeBackend(url, process)
    process.stop()


@pytest.fixture(scope="module")
def fault_database() -> Iterator[str]:
    # A database of its own: another stack's recovery loop on a shared database re-queues these tests'
    # pending messages on its own broker, and its workers of the same model answer them there.
    with fresh_database("oasst_faults") as url:
        yield url


@pytest.fixture(scope="module")
def fault_stack(
    cpu_backend: Backend, fault_database: str, redis_prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """Postgres + Redis, fast failure detection, no worker yet (each test brings its own)."""
    log_dir = tmp_path_factory.mktemp("fault-stack")
    stack = start_stack(
        log_dir,
        cpu_backend.url,
        fault_database,
        REDIS_URL,
        workers=0,
        OASST_SERVER_REDIS_KEY_PREFIX=f"{redis_prefix}faults:{uuid.uuid4().hex[:6]}:",
        **FAST_TIMINGS,
    )
    yield stack
    stack.stop()


def fake_model(name: str | None = None) -> ModelConfig:
    return ModelConfig(
        name=name or f"fake-{uuid.uuid4().hex[:8]}",
        model_id="fake",
        max_input_length=1000,
        max_total_length=2000,
        chat_template_source="backend",
    )


def start_fake_worker(stack: Stack, backend: FakeBackend, model: ModelConfig, **env: str) -> ManagedProcess:
    worker = stack.start_worker(
        backend_url=backend.url,
        OASST_WORKER_MODEL_CONFIG_JSON=model.model_dump_json(),
        OASST_WORKER_BACKEND_TOKEN_TIMEOUT=env.pop("OASST_WORKER_BACKEND_TOKEN_TIMEOUT", "2"),
        **env,
    )
    wait_for_model(stack.url, model.name)
    return worker
