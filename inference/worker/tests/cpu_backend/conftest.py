"""The real CPU backend (``python -m oasst_cpu_backend`` serving SmolLM2) in a subprocess, for these tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.processes import free_port

# A raw-text prompt the model continues for a long time: long generations without relying on chance.
COUNTING_PROMPT = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
# A question the model answers in one short sentence and then ends with its EOS token.
CHAT_PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
STORY_PROMPT = (
    "<|im_start|>user\nWrite a long story about a dragon who learns to bake bread.<|im_end|>\n"
    "<|im_start|>assistant\n"
)


@dataclass
class RunningBackend:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        """Prometheus samples by name with labels, e.g. 'oasst_cpu_backend_requests_total{outcome="success"}'."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        samples: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                samples[name] = float(value)
        return samples

    def metric(self, name: str) -> float:
        return self.metrics().get(name, 0.0)

    def wait_until(self, condition: Callable[[], bool], timeout: float = 60.0) -> None:
        """Polls a condition; the timeout only bounds a hang, it is not a speed assertion."""
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"condition not met within {timeout}s; backend log:\n{self.log()[-3000:]}"
                )
            time.sleep(0.05)

    def cancelled_token_counts(self) -> list[int]:
        return [int(n) for n in re.findall(r"cancelled after (\d+) tokens", self.log())]


def start_backend(log_dir: Path, **env: str) -> RunningBackend:
    port = free_port()
    log_path = log_dir / f"cpu-backend-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "oasst_cpu_backend"],
            env={
                **os.environ,
                "PYTHONUNBUFFERED": "1",
                "OASST_CPU_BACKEND_HOST": "127.0.0.1",
                "OASST_CPU_BACKEND_PORT": str(port),
                **env,
            },
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    backend = RunningBackend(f"http://127.0.0.1:{port}", proc, log_path)
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the CPU backend exited with {proc.returncode}:\n{backend.log()}")
        try:
            if httpx.get(f"{backend.url}/health", timeout=2).status_code == 200:
                return backend
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            stop_backend(backend)
            raise RuntimeError(f"the CPU backend did not become healthy:\n{backend.log()}")
        time.sleep(0.1)


def stop_backend(backend: RunningBackend) -> None:
    if backend.proc.poll() is None:
        backend.proc.send_signal(signal.SIGTERM)
        try:
            backend.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            backend.proc.kill()
            backend.proc.wait()


@pytest.fixture(scope="session")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBackend]:
    running = start_backend(tmp_path_factory.mktemp("cpu-backend"))
    try:
        yield running
    finally:
        stop_backend(running)
        # A clean shutdown is part of the contract: SIGTERM must not need the SIGKILL fallback. (uvicorn
        # re-raises the signal it handled once it has shut down, hence -SIGTERM.)
        assert running.proc.returncode in (0, -signal.SIGTERM), running.log()[-3000:]
        assert "Application shutdown complete" in running.log()
