"""Redis and Postgres restarts while workers are connected and answers are queued and streaming.

Each test runs its own Redis (a redis-server on a free port) or its own Postgres cluster (initdb in a
temporary directory), so restarting it touches nothing else on the machine. The workers are real
worker processes with the scripted fake backend. Every worker keeps its socket, no message is lost,
and the API answers 503 with Retry-After, never a 500, while the store is down.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.fake_workers import FAST_TIMINGS, FakeBackend, fake_model, start_fake_worker
from tests.support.fault_flows import new_api, queue, start_redis, wait_state
from tests.support.processes import ManagedProcess, free_port
from tests.support.services import REDIS_URL
from tests.support.stacks import Stack, start_stack

pytestmark = pytest.mark.slow

PG_BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"))), None)
# Long enough for a result to wait out a few seconds of outage inside the worker's connection.
OUTAGE_TIMINGS = {**FAST_TIMINGS, "OASST_SERVER_LEASE_SECONDS": "20", "OASST_SERVER_NO_WORKER_TIMEOUT": "60"}
SETTLED = {"complete", "failed", "aborted_by_worker"}


def probe_api(url: str, token: str) -> list[int]:
    """Statuses of a few calls that need the database and the broker."""
    statuses = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10) as client:
        for call in (lambda: client.get("/chats"), lambda: client.post("/chats", json={})):
            with contextlib.suppress(httpx.HTTPError):
                response = call()
                statuses.append(response.status_code)
                if response.status_code == 503:
                    assert response.headers.get("Retry-After"), response.headers
    return statuses


def no_reconnects(worker: ManagedProcess) -> bool:
    return "reconnecting" not in worker.log_tail(400)


@dataclass
class Outage:
    """What a stack went through while its store was down."""

    statuses: list[int]  # of the API calls made while the store was down
    streaming: list[dict]  # the two long answers that were streaming when it went down, once settled
    waiting: list[dict]  # the three short answers queued behind them, once settled
    lost_workers: list[str]  # the log of each worker that exited or reconnected


def ride_out_outage(
    stack: Stack, fake_backend: FakeBackend, stop_store: Callable[[], None], start_store: Callable[[], None]
) -> Outage:
    """Two fake workers, two long answers streaming and three waiting; then the store stops, the API is
    probed, and two seconds later the store starts again. The workers and the stack are stopped before
    it returns (or raises)."""
    workers: list[ManagedProcess] = []
    try:
        model = fake_model()
        workers = [start_fake_worker(stack, fake_backend, model) for _ in range(2)]
        api = new_api(stack)
        streaming = [queue(api, model.name, "[[slow]] long", max_new_tokens=60) for _ in range(2)]
        waiting = [queue(api, model.name, f"question {i}", max_new_tokens=4) for i in range(3)]
        time.sleep(0.5)
        stop_store()
        statuses = probe_api(stack.url, api.token)
        time.sleep(2.0)
        start_store()
        return Outage(
            statuses,
            streaming=[
                wait_state(api, chat_id, message_id, SETTLED, 60) for chat_id, message_id in streaming
            ],
            waiting=[wait_state(api, chat_id, message_id, SETTLED, 60) for chat_id, message_id in waiting],
            lost_workers=[w.log_tail() for w in workers if not (w.alive() and no_reconnects(w))],
        )
    finally:
        for worker in workers:
            worker.stop()
        stack.stop()


class PrivateRedis:
    """A redis-server of its own (no persistence) on a free port, which a test may kill and start again."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process = start_redis(self.port)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)

    def start(self) -> None:
        self.process = start_redis(self.port)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    yield server
    server.stop()


def test_a_redis_restart_keeps_every_worker_and_loses_no_message(
    cpu_backend, postgres_url, private_redis, tmp_path, fake_backend
):
    stack = start_stack(tmp_path, cpu_backend.url, postgres_url, private_redis.url, 0, **OUTAGE_TIMINGS)
    outage = ride_out_outage(stack, fake_backend, private_redis.kill, private_redis.start)
    assert 500 not in outage.statuses, outage.statuses
    for message in outage.streaming:
        assert message["state"] == "complete", message
        assert message["content"] == "".join(f" w{i}" for i in range(1, 61))
    for message in outage.waiting:
        assert message["state"] == "complete" and message["content"] == " w1 w2 w3 w4", message
    assert not outage.lost_workers, outage.lost_workers


class PrivatePostgres:
    """A throwaway cluster (trust auth) run as the postgres user, on a port of its own."""

    def __init__(self, root: Path):
        assert PG_BIN is not None, "no PostgreSQL binaries under /usr/lib/postgresql"
        self.root = root
        self.data = root / "data"
        self.port = free_port()
        root.mkdir(parents=True, exist_ok=True)
        shutil.chown(root, "postgres", "postgres")
        self._as_postgres(str(PG_BIN / "initdb"), "-D", str(self.data), "--auth=trust", "-U", "postgres")

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        log = str(self.root / "postgres.log")
        self._as_postgres(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", log, "-w", "start"
        )

    def stop(self, mode: str = "fast") -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def _as_postgres(self, *command: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *command], check=True, capture_output=True, timeout=120
        )


@pytest.fixture
def private_postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivatePostgres]:
    if shutil.which("runuser") is None or PG_BIN is None:
        pytest.fail("a private Postgres cluster needs runuser and the PostgreSQL server binaries")
    root = Path("/tmp") / f"oasst-pg-{uuid.uuid4().hex[:8]}"
    cluster = PrivatePostgres(root)
    cluster.start()
    yield cluster
    cluster.stop("immediate")
    shutil.rmtree(root, ignore_errors=True)


def test_a_postgres_restart_keeps_every_worker_and_loses_no_message(
    cpu_backend, private_postgres, redis_prefix, tmp_path, fake_backend
):
    stack = start_stack(
        tmp_path,
        cpu_backend.url,
        private_postgres.url,
        REDIS_URL,
        0,
        OASST_SERVER_REDIS_KEY_PREFIX=f"{redis_prefix}pg-restart:{uuid.uuid4().hex[:6]}:",
        **OUTAGE_TIMINGS,
    )
    outage = ride_out_outage(stack, fake_backend, private_postgres.stop, private_postgres.start)
    assert 500 not in outage.statuses and 503 in outage.statuses, outage.statuses
    for message in outage.streaming + outage.waiting:
        assert message["state"] == "complete", message
    assert not outage.lost_workers, outage.lost_workers


def test_the_first_requests_after_a_postgres_restart_succeed(private_postgres, redis_prefix, tmp_path):
    """The pool checks no connection with a round trip when it hands one out: a restart closes every
    pooled connection, and the pool replaces the closed ones instead of failing requests on them."""
    stack = start_stack(
        tmp_path,
        "http://127.0.0.1:9",  # no worker: only the API's own queries
        private_postgres.url,
        REDIS_URL,
        0,
        OASST_SERVER_REDIS_KEY_PREFIX=f"{redis_prefix}pg-first:{uuid.uuid4().hex[:6]}:",
        # Only the requests below use the pool (a recovery pass meeting a closed connection first
        # would refresh the pool for them).
        OASST_SERVER_RECOVERY_INTERVAL="3600",
    )
    try:
        token = new_api(stack).token

        def chats(_: object) -> int:
            with httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {token}"}) as client:
                return client.get("/chats", timeout=30).status_code

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            assert list(pool.map(chats, range(12))) == [200] * 12  # several pooled connections
            private_postgres.stop()
            private_postgres.start()
            assert list(pool.map(chats, range(12))) == [200] * 12
    finally:
        stack.stop()
