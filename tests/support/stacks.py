"""Whole stacks of real processes: the bundled CPU backend, a server, its workers; server replicas."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.processes import (
    ManagedProcess,
    free_port,
    start_process,
    wait_for_model,
    wait_http_ok,
    wait_started,
)
from tests.support.services import REDIS_URL

MODEL_NAME = "SmolLM2-135M-Instruct"
WORKER_API_KEY = "test-worker-key"


@dataclass
class BackendProcess:
    """A text-generation backend running as a process of its own (the CPU backend, a fake one)."""

    url: str
    process: ManagedProcess


def start_cpu_backend(log_dir: Path) -> BackendProcess:
    """The bundled CPU backend serving SmolLM2, once it answers (stopped if it does not)."""
    port = free_port()
    process = start_process(
        "cpu-backend",
        "oasst_cpu_backend",
        {"OASST_CPU_BACKEND_HOST": "127.0.0.1", "OASST_CPU_BACKEND_PORT": str(port)},
        log_dir,
    )
    url = f"http://127.0.0.1:{port}"
    wait_started(f"{url}/health", process, timeout=120)
    return BackendProcess(url, process)


@dataclass
class Stack:
    url: str
    model_name: str
    server: ManagedProcess
    workers: list[ManagedProcess]
    log_dir: Path
    server_env: dict[str, str]
    backend_url: str
    extra: list[ManagedProcess] = field(default_factory=list)

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://", 1)

    def start_worker(self, backend_url: str | None = None, **env: str) -> ManagedProcess:
        worker = start_process(
            f"worker{len(self.workers) + 1}",
            "oasst_worker",
            {
                "OASST_WORKER_SERVER_URL": self.ws_url,
                "OASST_WORKER_API_KEY": WORKER_API_KEY,
                "OASST_WORKER_BACKEND_URL": backend_url or self.backend_url,
                **env,
            },
            self.log_dir,
        )
        self.workers.append(worker)
        return worker

    def stop(self) -> None:
        for process in [*self.workers, *self.extra, self.server]:
            process.stop()


def server_env(port: int, database_url: str, broker_url: str | None, **extra: str) -> dict[str, str]:
    env = {
        "OASST_SERVER_HOST": "127.0.0.1",
        "OASST_SERVER_PORT": str(port),
        "OASST_SERVER_DATABASE_URL": database_url,
        "OASST_SERVER_WORKER_API_KEYS": f'["{WORKER_API_KEY}"]',
        "OASST_SERVER_WORKER_PING_INTERVAL": "1",
        "OASST_SERVER_WORKER_PING_TIMEOUT": "15",
        **extra,
    }
    if broker_url:
        env["OASST_SERVER_BROKER_URL"] = broker_url
    return env


def start_stack(
    log_dir: Path,
    backend_url: str,
    database_url: str,
    broker_url: str | None,
    workers: int = 1,
    port: int | None = None,
    **extra: str,
) -> Stack:
    """A server (on ``port``, else a free one) with ``workers`` workers; ``extra`` is server settings."""
    port = port or free_port()
    env = server_env(port, database_url, broker_url, **extra)
    server = start_process("server", "oasst_inference_server", env, log_dir)
    url = f"http://127.0.0.1:{port}"
    stack = Stack(url, MODEL_NAME, server, [], log_dir, env, backend_url)
    try:
        wait_http_ok(f"{url}/health", server, timeout=60)
        for _ in range(workers):
            stack.start_worker()
        if workers:
            wait_for_model(url, MODEL_NAME)
    except BaseException:
        stack.stop()
        raise
    return stack


def start_replicas(
    log_dir: Path,
    database_url: str,
    redis_prefix: str,
    names: Sequence[str] = ("replica-a", "replica-b"),
    **extra: str,
) -> list[tuple[str, ManagedProcess]]:
    """(URL, process) of server replicas sharing one database and one Redis key prefix (``extra`` is more
    server settings), started together, so their start-up migrations take turns, and each answering.
    No worker. If one does not start, all are stopped."""
    replicas: list[tuple[str, ManagedProcess]] = []
    try:
        for name in names:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            env = server_env(
                port,
                database_url,
                REDIS_URL,
                OASST_SERVER_REDIS_KEY_PREFIX=redis_prefix,
                OASST_SERVER_API_ROOT=url,
                **extra,
            )
            replicas.append((url, start_process(name, "oasst_inference_server", env, log_dir)))
        for url, process in replicas:
            wait_http_ok(f"{url}/health", process, timeout=90)
    except BaseException:
        for _, process in replicas:
            process.stop()
        raise
    return replicas
