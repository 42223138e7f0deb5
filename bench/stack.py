"""The processes a benchmark measures: the server, its workers, the backends (the instant one, the CPU one,
the bare relay) and the synthetic workers that speak the protocol themselves.

Every script starts the real processes with the helpers of ``tests/support/`` (as the tests do), in a
throwaway directory, on its own Postgres database and Redis key prefix (or SQLite and the in-process broker
with ``--embedded``), and :class:`BenchRun` removes them all at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import ROOT
from tests.support.processes import ManagedProcess, free_port, wait_for_model, wait_http_ok
from tests.support.services import REDIS_URL, create_database, delete_redis_prefix, drop_database
from tests.support.stacks import MODEL_NAME, WORKER_API_KEY

BENCH_DIR = ROOT / "bench"

INSTANT_MODEL = "bench-instant"
NO_ADMISSION_LIMITS = {
    "OASST_SERVER_RATE_LIMIT_PER_MINUTE": "0",
    "OASST_SERVER_MAX_CONCURRENT_GENERATIONS_PER_USER": "0",
    "OASST_SERVER_MAX_QUEUE_SIZE": "1000000",
}
# Benchmarks run synthetic workers with hundreds of slots: the most the protocol allows.
BENCH_WORKER_LIMITS = {"OASST_SERVER_MAX_SLOTS_PER_WORKER": "1024"}


class BenchRun:
    """Processes, a log directory, a Postgres database and a Redis prefix, all removed on exit."""

    def __init__(self, name: str, *, keep_logs: bool = False, embedded: bool = False):
        self.name = name
        self.keep_logs = keep_logs
        self.embedded = embedded
        self.log_dir = Path(tempfile.mkdtemp(prefix=f"oasst-bench-{name}-"))
        self.processes: list[ManagedProcess] = []
        self._cleanups: list[Callable[[], None]] = []
        self._failed = False

    def __enter__(self) -> BenchRun:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._failed = exc is not None
        self.close()

    def close(self) -> None:
        for process in reversed(self.processes):
            with contextlib.suppress(Exception):
                process.stop(timeout=10)
        self.processes.clear()
        for cleanup in reversed(self._cleanups):
            try:
                cleanup()
            except Exception as exc:  # cleanup must go on
                print(f"cleanup failed: {exc}", file=sys.stderr)
        self._cleanups.clear()
        if self.keep_logs or self._failed:
            print(f"logs kept in {self.log_dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def log_tails(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.log_tail(30)}" for p in self.processes)

    # ------------------------------------------------------------ processes
    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> ManagedProcess:
        log_path = self.log_dir / f"{name}-{uuid.uuid4().hex[:6]}.log"
        log = log_path.open("wb")
        proc = subprocess.Popen(
            argv,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.log_dir,
        )
        log.close()
        process = ManagedProcess(name, proc, log_path)
        self.processes.append(process)
        return process

    def stop(self, process: ManagedProcess) -> None:
        process.stop(signal.SIGTERM, timeout=10)
        if process in self.processes:
            self.processes.remove(process)

    def start_instant_backend(
        self, *, chunk: int = 8, token_delay: float = 0.0, token_rate: float = 0.0
    ) -> str:
        port = free_port()
        argv = [sys.executable, str(BENCH_DIR / "instant_backend.py"), "--port", str(port)]
        argv += ["--chunk", str(chunk), "--token-delay", str(token_delay), "--token-rate", str(token_rate)]
        process = self.spawn("instant-backend", argv)
        url = f"http://127.0.0.1:{port}"
        wait_http_ok(f"{url}/health", process, timeout=30)
        return url

    def start_bare_relay(self, backend_url: str, *, upstream: str = "openai") -> tuple[str, int]:
        """The bare relay (bench/bare_relay.py) in front of ``backend_url``: its URL and process id
        (``upstream`` "tgi": the relay that turns the backend's TGI stream into OpenAI chunks)."""
        port = free_port()
        argv = [sys.executable, "-m", "bench.bare_relay", "--port", str(port), "--backend", backend_url]
        argv += ["--upstream", upstream]
        process = self.spawn(f"bare-relay-{upstream}", argv, {"PYTHONPATH": str(ROOT)})
        url = f"http://127.0.0.1:{port}"
        wait_http_ok(f"{url}/health", process, timeout=30)
        return url, process.proc.pid

    def start_cpu_backend(self, **env: str) -> str:
        port = free_port()
        process = self.spawn(
            "cpu-backend",
            [sys.executable, "-m", "oasst_cpu_backend"],
            {"OASST_CPU_BACKEND_HOST": "127.0.0.1", "OASST_CPU_BACKEND_PORT": str(port), **env},
        )
        url = f"http://127.0.0.1:{port}"
        wait_http_ok(f"{url}/health", process, timeout=180)
        return url

    # ------------------------------------------------------------ storage
    def database(self) -> str:
        """A fresh database URL: SQLite in embedded mode, else a Postgres database dropped at the end."""
        if self.embedded:
            return f"sqlite+aiosqlite:///{self.log_dir}/oasst-{uuid.uuid4().hex[:6]}.db"
        url = create_database("oasst_bench")
        self._cleanups.append(lambda: drop_database(url))
        return url

    def redis_prefix(self) -> str | None:
        """A fresh Redis key prefix, all of whose keys are deleted at the end (None in embedded mode)."""
        if self.embedded:
            return None
        prefix = f"bench:{uuid.uuid4().hex[:10]}:"

        self._cleanups.append(lambda: delete_redis_prefix(prefix))
        return prefix

    def start_server(
        self, database_url: str, redis_prefix: str | None, *, admission_limits: bool = False, **extra: str
    ) -> Server:
        """A server process. Without ``admission_limits`` the per-user limits and the queue cap are off:
        the relay benchmarks measure the broker, and their synthetic users ask faster than people."""
        port = free_port()
        limits = {} if admission_limits else NO_ADMISSION_LIMITS
        env = {
            **limits,
            **BENCH_WORKER_LIMITS,
            "OASST_SERVER_ENVIRONMENT": "development",
            "OASST_SERVER_HOST": "127.0.0.1",
            "OASST_SERVER_PORT": str(port),
            "OASST_SERVER_DATABASE_URL": database_url,
            "OASST_SERVER_WORKER_API_KEYS": f'["{WORKER_API_KEY}"]',
            **extra,
        }
        if redis_prefix is not None:
            env["OASST_SERVER_BROKER_URL"] = REDIS_URL
            env["OASST_SERVER_REDIS_KEY_PREFIX"] = redis_prefix
        process = self.spawn(f"server{port}", [sys.executable, "-m", "oasst_inference_server"], env)
        url = f"http://127.0.0.1:{port}"
        wait_http_ok(f"{url}/health", process, timeout=90)
        return Server(url, process, database_url)

    def start_worker(
        self,
        server_url: str,
        backend_url: str,
        *,
        model: str = MODEL_NAME,
        max_parallel: int = 2,
        **extra: str,
    ) -> ManagedProcess:
        env = {
            "OASST_WORKER_SERVER_URL": server_url.replace("http://", "ws://", 1),
            "OASST_WORKER_API_KEY": WORKER_API_KEY,
            "OASST_WORKER_BACKEND_URL": backend_url,
            "OASST_WORKER_MAX_PARALLEL_REQUESTS": str(max_parallel),
            **extra,
        }
        if model == INSTANT_MODEL:
            env["OASST_WORKER_MODEL_CONFIG_JSON"] = instant_model_config().model_dump_json()
        else:
            env["OASST_WORKER_MODEL_CONFIG_NAME"] = model
        return self.spawn("worker", [sys.executable, "-m", "oasst_worker"], env)

    def start_stack(
        self, backend_url: str, *, model: str = INSTANT_MODEL, workers: int = 1, max_parallel: int = 2
    ) -> tuple[Server, list[ManagedProcess]]:
        """A server on a fresh database and key prefix, and ``workers`` workers of ``model`` on the backend,
        all registered."""
        server = self.start_server(self.database(), self.redis_prefix())
        procs = [
            self.start_worker(server.url, backend_url, model=model, max_parallel=max_parallel)
            for _ in range(workers)
        ]
        wait_for_model(server.url, model, workers=workers)
        return server, procs


@dataclass
class Server:
    url: str
    process: ManagedProcess
    database_url: str

    @property
    def pid(self) -> int:
        return self.process.proc.pid


async def connect_synthetic_worker(url: str, model_config: Any, slots: int) -> Any:
    """A websocket to the server's ``/workers/work`` that has announced itself as a worker of
    ``model_config`` with ``slots`` slots: the benchmarks' synthetic workers speak the protocol on it."""
    from websockets.asyncio.client import connect

    from oasst_shared.protocol import (
        API_KEY_HEADER,
        PROTOCOL_VERSION,
        PROTOCOL_VERSION_HEADER,
        WorkerInfo,
        dump_frame,
    )

    headers = {API_KEY_HEADER: WORKER_API_KEY, PROTOCOL_VERSION_HEADER: str(PROTOCOL_VERSION)}
    ws = await connect(url, additional_headers=headers, ping_interval=None, max_queue=None)
    info = WorkerInfo(model_config=model_config, max_parallel_requests=slots, backend_kind="fake")
    await ws.send(dump_frame(info))
    return ws


def instant_model_config(name: str = INSTANT_MODEL) -> Any:
    from oasst_shared.model_configs import ModelConfig

    return ModelConfig(
        name=name,
        model_id="bench/instant",
        description="the benchmarks' instant synthetic backend",
        max_input_length=4000,
        max_total_length=4000 + 65536,
        chat_template_source="backend",
        eos_token="<|im_end|>",
    )
