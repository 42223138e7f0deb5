"""Shared helpers of the benchmark scripts: processes, clients, statistics and the results format.

Every script starts the real processes (server, worker, backends) with the helpers of ``tests/support/`` (as the tests do),
in a throwaway directory, on its own Postgres database and Redis key prefix, and removes them at the end.
Each script prints its tables and, with ``--json PATH``, writes a :class:`Report` that ``run_all.py``
turns into docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx

from tests.support.processes import ManagedProcess, free_port, wait_http_ok
from tests.support.services import REDIS_URL, create_database, delete_redis_prefix, drop_database
from tests.support.stacks import MODEL_NAME, WORKER_API_KEY

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / "bench"

INSTANT_MODEL = "bench-instant"
NO_ADMISSION_LIMITS = {
    "OASST_SERVER_RATE_LIMIT_PER_MINUTE": "0",
    "OASST_SERVER_MAX_CONCURRENT_GENERATIONS_PER_USER": "0",
    "OASST_SERVER_MAX_QUEUE_SIZE": "1000000",
}
# Benchmarks run synthetic workers with hundreds of slots: the most the protocol allows.
BENCH_WORKER_LIMITS = {"OASST_SERVER_MAX_SLOTS_PER_WORKER": "1024"}
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- command line


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--tiny", action="store_true", help="CI mode: seconds, small numbers")
    p.add_argument("--json", type=Path, help="also write the report as JSON here")
    p.add_argument(
        "--embedded",
        action="store_true",
        help="run the server on SQLite with the in-process broker (default: Postgres and Redis)",
    )
    p.add_argument("--keep-logs", action="store_true", help="keep the processes' logs")
    return p


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


# ---------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def median(values: Sequence[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def ms(seconds: float | None, digits: int = 1) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.{digits}f}"


def signed_ms(seconds: float | None, digits: int = 1) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:+.{digits}f}"


def num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}"


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


# ---------------------------------------------------------------- processes and machine


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _status_kb(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory (VmHWM) in MiB."""
    return _status_kb(pid, "VmHWM") / 1024


def rss_mb(pid: int) -> float:
    return _status_kb(pid, "VmRSS") / 1024


def tree_pids(pid: int) -> list[int]:
    """The process and all its descendants."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, []))
    return out


def machine_info() -> dict[str, Any]:
    cpu_model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    mem_kb = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    commit = "unknown"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    load = None
    with contextlib.suppress(OSError):
        load = os.getloadavg()
    return {
        "nproc": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "cpu_model": cpu_model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "commit": commit,
        "loadavg": [round(x, 2) for x in load] if load else None,
    }


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

    def start_instant_backend(self, *, chunk: int = 8, token_delay: float = 0.0) -> str:
        port = free_port()
        argv = [sys.executable, str(BENCH_DIR / "instant_backend.py"), "--port", str(port)]
        argv += ["--chunk", str(chunk), "--token-delay", str(token_delay)]
        process = self.spawn("instant-backend", argv)
        url = f"http://127.0.0.1:{port}"
        wait_http_ok(f"{url}/health", process, timeout=30)
        return url

    def start_bare_relay(self, backend_url: str) -> tuple[str, int]:
        """The bare relay (bench/bare_relay.py) in front of ``backend_url``: its URL and process id."""
        port = free_port()
        argv = [sys.executable, "-m", "bench.bare_relay", "--port", str(port), "--backend", backend_url]
        process = self.spawn("bare-relay", argv, {"PYTHONPATH": str(ROOT)})
        url = f"http://127.0.0.1:{port}"
        wait_http_ok(f"{url}/health", process, timeout=30)
        return url, process.proc.pid

    def start_cpu_backend(self) -> str:
        port = free_port()
        process = self.spawn(
            "cpu-backend",
            [sys.executable, "-m", "oasst_cpu_backend"],
            {"OASST_CPU_BACKEND_HOST": "127.0.0.1", "OASST_CPU_BACKEND_PORT": str(port)},
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
        wait_workers(server.url, model, workers)
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


def wait_workers(server_url: str, model: str, count: int, timeout: float = 60) -> None:
    """Wait until ``count`` workers serve ``model`` (as /configs/model_configs reports them)."""
    deadline = time.monotonic() + timeout
    seen = 0
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError, TypeError, KeyError):
            for config in httpx.get(f"{server_url}/configs/model_configs", timeout=5).json():
                if config["name"] == model:
                    seen = int(config.get("worker_count", count))
                    if seen >= count:
                        return
        time.sleep(0.2)
    raise RuntimeError(f"only {seen} of {count} workers for {model} registered at {server_url}")


async def message_times(database_url: str, ids: Iterable[str]) -> dict[str, dict[str, float | None]]:
    """enqueued_at / started_at / finished_at (epoch seconds) of messages, read from the database."""
    wanted = list(ids)
    if not wanted:
        return {}
    columns = "id, enqueued_at, started_at, finished_at, state"
    rows: list[Any]
    if database_url.startswith("sqlite"):
        import sqlite3

        path = database_url.split(":///", 1)[1]
        conn = sqlite3.connect(path, timeout=30)
        try:
            rows = []
            for i in range(0, len(wanted), 500):
                part = wanted[i : i + 500]
                marks = ",".join("?" * len(part))
                rows += conn.execute(f"SELECT {columns} FROM message WHERE id IN ({marks})", part).fetchall()
        finally:
            conn.close()
    else:
        import asyncpg

        conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://", 1))
        try:
            rows = await conn.fetch(f"SELECT {columns} FROM message WHERE id = ANY($1::varchar[])", wanted)
        finally:
            await conn.close()
    out: dict[str, dict[str, float | None]] = {}
    for row in rows:
        out[row[0]] = {
            "enqueued_at": _epoch(row[1]),
            "started_at": _epoch(row[2]),
            "finished_at": _epoch(row[3]),
        }
        out[row[0]]["state"] = row[4]  # type: ignore[assignment]
    return out


def _epoch(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return float(value.timestamp())


# ---------------------------------------------------------------- HTTP clients


def http_client(concurrency: int) -> httpx.AsyncClient:
    size = 2 * concurrency + 50
    return httpx.AsyncClient(
        timeout=httpx.Timeout(600.0, connect=60.0, pool=600.0),
        # Idle connections are dropped before uvicorn's 5 s keep-alive timeout closes them from its side:
        # a request sent on a connection the server is closing fails with a ReadError.
        limits=httpx.Limits(max_connections=size, max_keepalive_connections=size, keepalive_expiry=2.0),
    )


class BenchHttpError(Exception):
    pass


async def _retrying(call: Callable[[], Awaitable[httpx.Response]], attempts: int = 3) -> httpx.Response:
    """A setup request (login, new chat, prompt), sent again if the connection broke before an answer."""
    for attempt in range(attempts):
        try:
            return await call()
        except (httpx.ReadError, httpx.RemoteProtocolError, httpx.ConnectError):
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def _check(response: httpx.Response) -> Any:
    if response.status_code >= 300:
        raise BenchHttpError(
            f"HTTP {response.status_code} on {response.request.url.path}: {response.text[:200]}"
        )
    return response.json()


@dataclass
class StreamResult:
    """One streamed generation as a client saw it (times from time.perf_counter())."""

    started: float
    first_token: float | None = None
    last_token: float | None = None
    ended: float | None = None
    tokens: int = 0
    text: str = ""
    ok: bool = False
    error: str | None = None
    generated_tokens: int | None = None
    final: dict[str, Any] | None = None
    message_id: str | None = None
    retries: int = 0

    def count_token(self) -> None:
        """A token arrived now."""
        now = time.perf_counter()
        if self.first_token is None:
            self.first_token = now
        self.last_token = now
        self.tokens += 1

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.started

    @property
    def decode_rate(self) -> float | None:
        """Tokens per second after the first one."""
        if self.first_token is None or self.last_token is None or self.tokens < 2:
            return None
        span = self.last_token - self.first_token
        return (self.tokens - 1) / span if span > 0 else None


async def _sse_events(response: httpx.Response) -> Any:
    """(id, data) of each server-sent event of a response."""
    buffer = ""
    async for chunk in response.aiter_text():
        buffer += chunk
        if "\r" in buffer:
            buffer = buffer.replace("\r\n", "\n")
        while "\n\n" in buffer:
            block, buffer = buffer.split("\n\n", 1)
            event_id, data = None, []
            for line in block.split("\n"):
                if line.startswith("data:"):
                    data.append(line[5:].lstrip(" "))
                elif line.startswith("id:"):
                    event_id = line[3:].strip()
            if data:
                yield event_id, "\n".join(data)


class OurApi:
    """The server's chat API, as a load generator uses it."""

    def __init__(self, client: httpx.AsyncClient, base_url: str):
        self.client = client
        self.base = base_url.rstrip("/")

    async def login(self, username: str) -> str:
        response = await _retrying(
            lambda: self.client.get(f"{self.base}/auth/callback/debug", params={"code": username})
        )
        return str(_check(response)["access_token"]["access_token"])

    @staticmethod
    def auth(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    async def create_chat(self, token: str) -> str:
        response = await _retrying(
            lambda: self.client.post(f"{self.base}/chats", json={}, headers=self.auth(token))
        )
        return str(_check(response)["id"])

    async def prompter(self, token: str, chat_id: str, parent_id: str | None, content: str) -> str:
        response = await _retrying(
            lambda: self.client.post(
                f"{self.base}/chats/{chat_id}/prompter_message",
                json={"parent_id": parent_id, "content": content},
                headers=self.auth(token),
            )
        )
        return str(_check(response)["id"])

    async def assistant(
        self, token: str, chat_id: str, parent_id: str, model: str, max_new_tokens: int
    ) -> str:
        response = await self.client.post(
            f"{self.base}/chats/{chat_id}/assistant_message",
            json={
                "parent_id": parent_id,
                "model_config_name": model,
                "sampling_parameters": {"do_sample": False, "max_new_tokens": max_new_tokens},
            },
            headers=self.auth(token),
        )
        return str(_check(response)["id"])

    async def ask(
        self, token: str, chat_id: str, parent_id: str, model: str, max_new_tokens: int, readers: int = 1
    ) -> StreamResult:
        """Queue an answer and stream it; timed from the assistant_message request.

        ``readers`` > 1 reads the answer with that many event streams at once (several tabs); the
        result is the first one's, failed if any of the others failed or saw other text.
        """
        result = StreamResult(started=time.perf_counter())
        try:
            message_id = await self.assistant(token, chat_id, parent_id, model, max_new_tokens)
            result.message_id = message_id
            others = [StreamResult(started=result.started) for _ in range(readers - 1)]
            await asyncio.gather(
                self.read_events(token, chat_id, message_id, result),
                *(self.read_events(token, chat_id, message_id, other) for other in others),
            )
            for other in others:
                if result.ok and (not other.ok or other.text != result.text):
                    result.ok = False
                    result.error = f"another reader of the answer: {other.error or 'other text'}"
        except (httpx.HTTPError, BenchHttpError, ValueError) as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        result.ended = result.ended or time.perf_counter()
        return result

    async def prompt_and_ask(
        self, token: str, chat_id: str, content: str, model: str, max_new_tokens: int
    ) -> StreamResult:
        """A turn in three requests (prompter_message, assistant_message, events), timed from the first."""
        started = time.perf_counter()
        try:
            parent_id = await self.prompter(token, chat_id, None, content)
        except (httpx.HTTPError, BenchHttpError, ValueError) as exc:
            return StreamResult(
                started=started, ended=time.perf_counter(), error=f"{type(exc).__name__}: {exc}"
            )
        result = await self.ask(token, chat_id, parent_id, model, max_new_tokens)
        result.started = started
        return result

    async def turn(
        self, token: str, chat_id: str, content: str, model: str, max_new_tokens: int
    ) -> StreamResult:
        """A turn in one request (``POST /chats/{id}/turns``), timed from it to the answer's last event."""
        result = StreamResult(started=time.perf_counter())
        body = {
            "parent_id": None,
            "content": content,
            "model_config_name": model,
            "sampling_parameters": {"do_sample": False, "max_new_tokens": max_new_tokens},
        }
        headers = {**self.auth(token), "Accept": "text/event-stream"}
        try:
            async with self.client.stream(
                "POST", f"{self.base}/chats/{chat_id}/turns", json=body, headers=headers
            ) as response:
                await self._read_answer(response, result)
        except (httpx.HTTPError, BenchHttpError, ValueError) as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        result.ended = result.ended or time.perf_counter()
        return result

    async def read_events(self, token: str, chat_id: str, message_id: str, result: StreamResult) -> None:
        url = f"{self.base}/chats/{chat_id}/messages/{message_id}/events"
        headers = {**self.auth(token), "Accept": "text/event-stream"}
        async with self.client.stream("GET", url, headers=headers) as response:
            await self._read_answer(response, result)

    @staticmethod
    async def _read_answer(response: httpx.Response, result: StreamResult) -> None:
        """Read an answer's server-sent events into ``result``, to its terminal event."""
        if response.status_code != 200:
            await response.aread()
            raise BenchHttpError(f"HTTP {response.status_code} on {response.url.path}: {response.text[:200]}")
        parts: list[str] = []
        async for _, data in _sse_events(response):
            if data.startswith('{"event_type":"token"'):
                result.count_token()
                parts.append(json.loads(data)["text"])
                continue
            event = json.loads(data)
            kind = event.get("event_type")
            if kind == "created":
                result.message_id = event["assistant_message"]["id"]
            elif kind == "retry":
                # Another worker starts over: the tokens so far are void (the first one was still seen).
                parts.clear()
                result.tokens = 0
                result.retries += 1
            elif kind in ("message", "error"):
                result.ended = time.perf_counter()
                result.final = event
                message = event.get("message") or {}
                result.generated_tokens = message.get("generated_tokens")
                result.text = "".join(parts)
                if kind == "message" and message.get("state") == "complete":
                    result.ok = True
                else:
                    result.error = f"{kind}: {event.get('error') or message.get('state')}"
                return
        result.text = "".join(parts)
        result.error = "the event stream ended without a terminal event"


async def stream_tgi(
    client: httpx.AsyncClient, backend_url: str, prompt: str, max_new_tokens: int
) -> StreamResult:
    """Generate straight from a text-generation-inference backend (POST /generate_stream)."""
    result = StreamResult(started=time.perf_counter())
    body = {"inputs": prompt, "parameters": {"do_sample": False, "max_new_tokens": max_new_tokens}}
    parts: list[str] = []
    try:
        async with client.stream("POST", f"{backend_url}/generate_stream", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                raise BenchHttpError(f"HTTP {response.status_code}: {response.text[:200]}")
            async for _, data in _sse_events(response):
                event = json.loads(data)
                if "error" in event:
                    raise BenchHttpError(str(event["error"]))
                result.count_token()
                token = event.get("token") or {}
                if not token.get("special"):
                    parts.append(token.get("text", ""))
                if event.get("details"):
                    result.generated_tokens = event["details"].get("generated_tokens")
                    result.ok = True
        if not result.ok:
            result.error = "the stream ended without details"
    except (httpx.HTTPError, BenchHttpError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    result.text = "".join(parts)
    result.ended = time.perf_counter()
    return result


async def stream_openai(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    messages: list[dict[str, str]],
    max_tokens: int,
    api_key: str | None = None,
) -> StreamResult:
    """A streamed OpenAI chat completion (``base_url`` ends before ``/v1``)."""
    result = StreamResult(started=time.perf_counter())
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": True, "temperature": 0}
    parts: list[str] = []
    try:
        async with client.stream(
            "POST", f"{base_url}/v1/chat/completions", json=body, headers=headers
        ) as response:
            if response.status_code != 200:
                await response.aread()
                raise BenchHttpError(f"HTTP {response.status_code}: {response.text[:200]}")
            async for _, data in _sse_events(response):
                if data.strip() == "[DONE]":
                    result.ok = True
                    break
                event = json.loads(data)
                if "error" in event:
                    raise BenchHttpError(str(event["error"])[:200])
                for choice in event.get("choices") or []:
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        result.count_token()
                        parts.append(content)
        if not result.ok:
            result.error = "the stream ended without [DONE]"
    except (httpx.HTTPError, BenchHttpError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    result.text = "".join(parts)
    result.generated_tokens = result.tokens
    result.ended = time.perf_counter()
    return result


async def login_users(api: OurApi, count: int, prefix: str, concurrency: int = 32) -> list[str]:
    semaphore = asyncio.Semaphore(concurrency)

    async def one(i: int) -> str:
        async with semaphore:
            return await api.login(f"{prefix}-{i}")

    return list(await asyncio.gather(*(one(i) for i in range(count))))


async def gather_limited(factories: Sequence[Callable[[], Awaitable[Any]]], concurrency: int) -> list[Any]:
    semaphore = asyncio.Semaphore(concurrency)

    async def one(factory: Callable[[], Awaitable[Any]]) -> Any:
        async with semaphore:
            return await factory()

    return list(await asyncio.gather(*(one(f) for f in factories)))


async def closed_loop(
    concurrency: int, total: int, request: Callable[[int, int], Awaitable[StreamResult]]
) -> list[StreamResult]:
    """``total`` requests, ``concurrency`` at a time: task k sends requests k, k + c, k + 2c, ... in turn.

    ``request(task, index)`` is awaited for every index in 0..total-1; index i always runs on task
    ``i % concurrency``, so per-task state (a user, a chat) can be prepared by index.
    """
    c = max(1, min(concurrency, total))
    results: list[StreamResult] = []

    async def task(k: int) -> None:
        for index in range(k, total, c):
            results.append(await request(k, index))

    await asyncio.gather(*(task(k) for k in range(c)))
    return results


async def prepare_ours(
    apis: Sequence[OurApi],
    users: Sequence[str],
    concurrency: int,
    total: int,
    model: str,
    tokens: int,
    prompt: str,
    readers: int = 1,
) -> Callable[[], Awaitable[list[StreamResult]]]:
    """Make the chats and prompts of a closed-loop load (untimed); return the timed part to await.

    Task k sends its requests as ``users[k]`` to ``apis[k % len(apis)]`` (several replicas: round robin),
    and reads each answer with ``readers`` event streams at once.
    """
    c = max(1, min(concurrency, total))

    async def setup(i: int) -> tuple[str, str]:
        k = i % c
        api, user = apis[k % len(apis)], users[k]
        chat_id = await api.create_chat(user)
        return chat_id, await api.prompter(user, chat_id, None, prompt)

    setups = await gather_limited([lambda i=i: setup(i) for i in range(total)], concurrency=min(c, 50))

    async def request(k: int, i: int) -> StreamResult:
        chat_id, parent_id = setups[i]
        return await apis[k % len(apis)].ask(users[k], chat_id, parent_id, model, tokens, readers)

    async def timed() -> list[StreamResult]:
        return await closed_loop(c, total, request)

    return timed


@dataclass
class LoadSummary:
    requests: int
    errors: int
    tokens: int
    wall: float
    ttft: list[float]
    first_error: str | None
    rejected: int = 0  # errors that were the server's refusals (HTTP 429/503: queue full, rate limit)

    @property
    def error_cell(self) -> str:
        return f"{self.errors} ({self.rejected} refused)" if self.rejected else str(self.errors)

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.wall if self.wall > 0 else None

    def ttft_p(self, q: float) -> float | None:
        return percentile(self.ttft, q)


def summarize(results: Sequence[StreamResult]) -> LoadSummary:
    good = [r for r in results if r.ok]
    errors = [r for r in results if not r.ok]
    start = min((r.started for r in results), default=0.0)
    end = max((r.ended or r.started for r in results), default=0.0)
    return LoadSummary(
        requests=len(results),
        errors=len(errors),
        tokens=sum(r.tokens for r in good),
        wall=end - start,
        ttft=[r.ttft for r in good if r.ttft is not None],
        first_error=errors[0].error if errors else None,
        rejected=sum(1 for r in errors if r.error and ("HTTP 503" in r.error or "HTTP 429" in r.error)),
    )


# ---------------------------------------------------------------- reports


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)

    def render(self) -> str:
        widths = [max(len(str(c)), *(len(str(r[i])) for r in self.rows)) for i, c in enumerate(self.columns)]
        lines = [self.title, "  ".join(str(c).rjust(w) for c, w in zip(self.columns, widths, strict=True))]
        lines += ["  ".join(str(v).rjust(w) for v, w in zip(row, widths, strict=True)) for row in self.rows]
        return "\n".join(lines)


@dataclass
class Target:
    name: str
    target: str
    measured: str
    met: bool | None  # None: not measured in this run


@dataclass
class Report:
    script: str
    title: str
    tiny: bool
    params: dict[str, Any] = field(default_factory=dict)
    tables: list[Table] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=machine_info)
    started_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    seconds: float = 0.0

    def note_failures(self, label: str, summary: LoadSummary) -> None:
        if summary.errors:
            self.notes.append(
                f"{label}: {summary.errors} of {summary.requests} failed; "
                f"the first: {(summary.first_error or '')[:300]}"
            )

    def emit(self, json_path: Path | None) -> None:
        print()
        print(f"== {self.title}{' (tiny mode)' if self.tiny else ''}")
        for table in self.tables:
            print()
            print(table.render())
        if self.targets:
            print()
            for t in self.targets:
                state = {True: "MET", False: "NOT MET", None: "n/a"}[t.met]
                print(f"target {t.name}: {t.target} -> {t.measured} [{state}]")
        for note in self.notes:
            print(f"note: {note}")
        if json_path is not None:
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(json.dumps(asdict(self), indent=2, default=str))


def main_wrapper(
    report_fn: Callable[[argparse.Namespace], Awaitable[Report]], args: argparse.Namespace
) -> None:
    """Run a script's async body and emit its report; exit 1 on failure."""
    started = time.perf_counter()
    report = asyncio.run(report_fn(args))
    report.seconds = round(time.perf_counter() - started, 1)
    report.emit(args.json)
