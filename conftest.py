"""Fixtures shared by every package's tests: the real Postgres, Redis, CPU backend and whole stacks.

Every fixture here starts real processes or uses the real local services; each test database and
Redis key prefix is created for the run and removed afterwards.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

# Production is the server's default; the tests ask for development (known secrets, debug login,
# /docs and /metrics) here, for in-process apps and for every server process they start. A test of
# production mode sets its own environment.
os.environ["OASST_SERVER_ENVIRONMENT"] = "development"

POSTGRES_ADMIN_DSN = os.environ.get("OASST_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("OASST_TEST_REDIS", "redis://127.0.0.1:6379/0")
MODEL_NAME = "SmolLM2-135M-Instruct"
WORKER_API_KEY = "test-worker-key"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ManagedProcess:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        self.stop(signal.SIGKILL, timeout=5)


def start_process(name: str, module: str, env: dict[str, str], log_dir: Path) -> ManagedProcess:
    log_path = log_dir / f"{name}-{uuid.uuid4().hex[:6]}.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", module],
        env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=log_dir,
    )
    return ManagedProcess(name, proc, log_path)


def wait_http_ok(url: str, process: ManagedProcess, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.alive():
            raise RuntimeError(f"{process.name} exited early:\n{process.log_tail()}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{process.name} did not become healthy at {url}:\n{process.log_tail()}")


def wait_for_model(server_url: str, model: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            names = [m["name"] for m in httpx.get(f"{server_url}/configs/model_configs", timeout=2).json()]
            if model in names:
                return
        except (httpx.HTTPError, ValueError, TypeError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"no worker for {model} registered at {server_url}")


# ---------------------------------------------------------------- Postgres and Redis


async def _admin(sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(POSTGRES_ADMIN_DSN)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def admin_sql(sql: str) -> None:
    # In a thread of its own, so callers that run inside an event loop (benchmarks) can use it too.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, _admin(sql)).result()


def create_database(prefix: str = "oasst_test") -> str:
    """Create an empty Postgres database and return its asyncpg URL (drop it with drop_database)."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin_sql(f'CREATE DATABASE "{name}"')
    base = POSTGRES_ADMIN_DSN.rsplit("/", 1)[0]
    return f"{base}/{name}".replace("postgresql://", "postgresql+asyncpg://", 1)


def drop_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    admin_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def fresh_database(prefix: str = "oasst_test") -> Iterator[str]:
    """An empty Postgres database for the ``with`` block, dropped afterwards."""
    url = create_database(prefix)
    try:
        yield url
    finally:
        drop_database(url)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh Postgres database for this test session, dropped at the end."""
    with fresh_database() as url:
        yield url


def delete_redis_prefix(prefix: str) -> None:
    """Delete every key under ``prefix`` in the local Redis."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    finally:
        client.close()


@contextlib.contextmanager
def fresh_redis_prefix(tag: str = "test") -> Iterator[str]:
    """A new Redis key prefix for the ``with`` block; every key under it is deleted afterwards."""
    prefix = f"{tag}:{uuid.uuid4().hex[:10]}:"
    try:
        yield prefix
    finally:
        delete_redis_prefix(prefix)


@pytest.fixture(scope="session")
def redis_prefix() -> Iterator[str]:
    """A Redis key prefix for this test session; every key under it is deleted at the end."""
    with fresh_redis_prefix() as prefix:
        yield prefix


# ---------------------------------------------------------------- the real CPU backend


@dataclass
class Backend:
    url: str
    process: ManagedProcess


@pytest.fixture(scope="session")
def cpu_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    """The bundled CPU backend serving SmolLM2, shared by the whole session."""
    port = free_port()
    log_dir = tmp_path_factory.mktemp("cpu-backend")
    process = start_process(
        "cpu-backend",
        "oasst_cpu_backend",
        {"OASST_CPU_BACKEND_HOST": "127.0.0.1", "OASST_CPU_BACKEND_PORT": str(port)},
        log_dir,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(f"{url}/health", process, timeout=120)
        yield Backend(url, process)
    finally:
        process.stop()


# ---------------------------------------------------------------- whole stacks


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


@pytest.fixture(scope="session")
def embedded_stack(cpu_backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Server on SQLite with the in-process broker, one worker, the real CPU backend."""
    log_dir = tmp_path_factory.mktemp("embedded-stack")
    stack = start_stack(log_dir, cpu_backend.url, f"sqlite+aiosqlite:///{log_dir}/oasst.db", None)
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def production_stack(
    cpu_backend: Backend, postgres_url: str, redis_prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """Server on Postgres and Redis, one worker, the real CPU backend."""
    log_dir = tmp_path_factory.mktemp("production-stack")
    stack = start_stack(
        log_dir, cpu_backend.url, postgres_url, REDIS_URL, OASST_SERVER_REDIS_KEY_PREFIX=redis_prefix
    )
    yield stack
    stack.stop()
