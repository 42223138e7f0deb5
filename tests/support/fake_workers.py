"""The scripted fake backend (``fake_backend.py``, for fault injection only) and workers in front of it."""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx

from oasst_shared.model_configs import ModelConfig
from tests.support.processes import ManagedProcess, free_port, spawn, wait_for_model, wait_started
from tests.support.stacks import Stack

# Server settings that detect lost workers and expired leases in seconds rather than minutes.
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

    def prompts(self) -> list[str]:
        return list(httpx.get(f"{self.url}/prompts", timeout=5).json())


def start_fake_backend(log_dir: Path, port: int | None = None) -> FakeBackend:
    """The scripted backend on ``port`` (else a free one), once it answers."""
    port = port or free_port()
    script = str(Path(__file__).parent / "fake_backend.py")
    process = spawn("fake-backend", [sys.executable, script, str(port)], {}, log_dir)
    url = f"http://127.0.0.1:{port}"
    wait_started(f"{url}/health", process, timeout=30)
    return FakeBackend(url, process)


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
