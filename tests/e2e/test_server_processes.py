"""``OASST_SERVER_PROCESSES=2``: one server command, two processes sharing its port on Postgres and Redis.

The processes are found as the children of the started command, and which of them serves a connection
is read from ``/proc`` (the process holding the server end of that TCP connection), so the server
publishes nothing about its processes. A worker connected to one process answers a chat asked through
connections to either; stopping the command stops every process.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.chat_api import ChatApi, tokens_text
from tests.support.fake_workers import FakeBackend, fake_model, start_fake_backend, start_fake_worker
from tests.support.services import REDIS_URL, fresh_database, fresh_redis_prefix
from tests.support.stacks import Stack, start_stack

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name (in parentheses) may hold spaces: the fields after it are fixed.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def server_processes(supervisor: int) -> list[int]:
    """The app processes uvicorn's supervisor spawned (not its other children, such as
    multiprocessing's resource tracker)."""
    found = []
    for pid in children(supervisor):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"multiprocessing.spawn" in command:
            found.append(pid)
    return found


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _hex_address(port: int) -> str:
    return f"0100007F:{port:04X}"  # 127.0.0.1 as /proc/net/tcp spells it


def _tcp_connections() -> list[tuple[str, str, str]]:
    """(local address, remote address, socket inode) of every IPv4 TCP socket."""
    rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    return [(row[1], row[2], row[9]) for row in rows]


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        descriptors = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return inodes
    for fd in descriptors:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def serving_processes(client_pid: int, port: int, candidates: list[int]) -> set[int]:
    """Which of ``candidates`` hold the server ends of the connections ``client_pid`` has open to
    127.0.0.1:port (from /proc/net/tcp and the processes' file descriptors)."""
    connections = _tcp_connections()
    client_inodes = _socket_inodes(client_pid)
    client_ends = {
        local
        for local, remote, inode in connections
        if remote == _hex_address(port) and inode in client_inodes
    }
    server_inodes = {
        inode for local, remote, inode in connections if local == _hex_address(port) and remote in client_ends
    }
    return {pid for pid in candidates if _socket_inodes(pid) & server_inodes}


def serving_process(port: int, candidates: list[int]) -> set[int]:
    """Open a connection, get /health through it and, while it is open, say which process serves it."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/health")
        response = connection.getresponse()
        response.read()
        assert response.status == 200
        client_end = _hex_address(connection.sock.getsockname()[1])
        inodes = {inode for local, remote, inode in _tcp_connections() if remote == client_end}
        return {pid for pid in candidates if _socket_inodes(pid) & inodes}
    finally:
        connection.close()


@pytest.fixture
def two_process_stack(tmp_path: Path) -> Iterator[tuple[Stack, FakeBackend]]:
    """The server with two processes (no worker yet) and the scripted backend for a worker."""
    backend = start_fake_backend(tmp_path)
    try:
        with fresh_database("oasst_processes") as database, fresh_redis_prefix("test:processes") as prefix:
            stack = start_stack(
                tmp_path,
                backend.url,
                database,
                REDIS_URL,
                workers=0,
                OASST_SERVER_PROCESSES="2",
                OASST_SERVER_REDIS_KEY_PREFIX=prefix,
            )
            try:
                yield stack, backend
            finally:
                stack.stop()
    finally:
        backend.process.stop()


def test_two_server_processes_share_the_port_serve_a_chat_and_stop_together(
    two_process_stack: tuple[Stack, FakeBackend],
):
    stack, fake_backend = two_process_stack
    port = int(stack.url.rsplit(":", 1)[1])
    supervisor = stack.server.proc.pid
    deadline = time.monotonic() + 30
    while len(processes := server_processes(supervisor)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(processes) == 2, (processes, stack.server.log_tail())

    # Connections are accepted by both processes (the supervisor itself serves none).
    served_by: set[int] = set()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for _ in range(10):
            for found in pool.map(lambda _: serving_process(port, [*processes, supervisor]), range(16)):
                assert len(found) == 1, found
                served_by |= found
            if served_by == set(processes):
                break
    assert served_by == set(processes), (served_by, processes)

    # A worker holds its socket in one process; a chat asked through a connection to the other one
    # streams its answer to the end (through Redis), as does one asked through the worker's process.
    model = fake_model()
    worker = start_fake_worker(stack, fake_backend, model)
    (worker_side,) = serving_processes(worker.proc.pid, port, processes)
    asked_through = set()
    for _ in range(40):
        api = ChatApi(stack.url, f"processes-{uuid.uuid4().hex[:6]}")  # a new connection
        (serving,) = serving_processes(os.getpid(), port, processes)
        if serving in asked_through:
            api.client.close()
            continue
        asked_through.add(serving)
        chat_id = api.create_chat()
        # Kept alive: the chat's requests and its event stream go through the same connection.
        assert serving_processes(os.getpid(), port, processes) == {serving}
        _, events = api.ask(chat_id, "a question", model.name, max_new_tokens=6)
        kinds = [e.data["event_type"] for e in events]
        assert kinds[-1] == "message" and "error" not in kinds and "token" in kinds, kinds
        final = events[-1].data["message"]
        assert final["state"] == "complete" and final["content"] == tokens_text(events) != ""
        api.client.close()
        if asked_through == set(processes):
            break
    assert asked_through == set(processes) and asked_through - {worker_side}  # one crossed processes

    # The start-up migrations ran once: the second process waited for the first, then found them done.
    log = stack.server.log_path.read_text(errors="replace")
    assert log.count("Running upgrade  -> ") == 1 and log.count("inference server ready") == 2, log

    # Stopping the command stops all its processes.
    for worker in stack.workers:
        worker.stop()
    everything = children(supervisor)
    assert stack.server.stop() == 0, stack.server.log_tail()
    # The server processes are joined before the command exits; a helper of multiprocessing (its
    # resource tracker) ends when it sees the command gone, a moment later on a loaded machine.
    deadline = time.monotonic() + 10
    while (left := [pid for pid in everything if running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in left]
