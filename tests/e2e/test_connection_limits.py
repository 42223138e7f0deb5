"""The server's own bounds on connections, with real sockets against real server processes, in both ways
it runs: one process on SQLite (as ``make up``), and two processes sharing the port on Postgres and Redis
(``OASST_SERVER_PROCESSES``, as the images may run). Nothing in front of it.

- A request head (line and headers) must arrive whole within ``OASST_SERVER_REQUEST_HEADER_TIMEOUT``,
  from when the connection opens or from the first byte of a later request on it: a client that sends
  one byte now and then (slowloris), or nothing, is answered 408 and closed.
- A head over ``OASST_SERVER_MAX_REQUEST_HEADER_BYTES`` is answered 431 and closed, without reading
  the rest of it.
- Past ``OASST_SERVER_MAX_CONNECTIONS`` open connections in a process, a new connection is answered
  503 with Retry-After and closed; the open ones keep working, and once one closes a new one is served.
- A normal client, a long response and a worker's websocket are not touched by any of it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from oasst_shared.model_configs import SMOLLM2_135M
from oasst_shared.protocol import PROTOCOL_VERSION, GeneratedText, WorkerInfo, dump_frame
from tests.e2e.chat_api import ChatApi
from tests.support.processes import ManagedProcess, free_port, start_process, wait_for_model, wait_http_ok
from tests.support.services import REDIS_URL, fresh_database, fresh_redis_prefix
from tests.support.stacks import WORKER_API_KEY, server_env

pytestmark = pytest.mark.slow

HEADER_TIMEOUT = 2.0  # seconds
MAX_HEADER_BYTES = 8192
MAX_CONNECTIONS = 6  # per process
LIMITS = {
    "OASST_SERVER_REQUEST_HEADER_TIMEOUT": str(HEADER_TIMEOUT),
    "OASST_SERVER_MAX_REQUEST_HEADER_BYTES": str(MAX_HEADER_BYTES),
    "OASST_SERVER_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
    "OASST_SERVER_SSE_PING_INTERVAL": "1",  # an idle event stream says something every second
}


class Server:
    def __init__(self, port: int, process: ManagedProcess, processes: int) -> None:
        self.port = port
        self.process = process
        self.processes = processes
        self.url = f"http://127.0.0.1:{port}"

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        sock.settimeout(30)
        return sock


@pytest.fixture(scope="module", params=["one-process-sqlite", "two-processes-postgres"])
def server(request, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log_dir: Path = tmp_path_factory.mktemp(request.param)
    port = free_port()
    if request.param == "one-process-sqlite":
        env = server_env(port, f"sqlite+aiosqlite:///{log_dir}/oasst.db", None, **LIMITS)
        process = start_process("server", "oasst_inference_server", env, log_dir)
        try:
            wait_http_ok(f"http://127.0.0.1:{port}/health", process, timeout=60)
            yield Server(port, process, 1)
        finally:
            process.stop()
        return
    with fresh_database("oasst_limits") as database, fresh_redis_prefix("test:limits") as prefix:
        env = server_env(
            port,
            database,
            REDIS_URL,
            OASST_SERVER_PROCESSES="2",
            OASST_SERVER_REDIS_KEY_PREFIX=prefix,
            **LIMITS,
        )
        process = start_process("server", "oasst_inference_server", env, log_dir)
        try:
            wait_http_ok(f"http://127.0.0.1:{port}/health", process, timeout=90)
            # Both processes up: each answers, whichever accepts the connection.
            deadline = time.monotonic() + 60
            while process.log_path.read_text(errors="replace").count("inference server ready") < 2:
                assert time.monotonic() < deadline, process.log_tail()
                time.sleep(0.2)
            yield Server(port, process, 2)
        finally:
            process.stop()


WORKER_HEADERS = {"X-API-Key": WORKER_API_KEY, "X-Protocol-Version": str(PROTOCOL_VERSION)}


def own_worker_info() -> WorkerInfo:
    """A worker of a model of its own (it takes no other test's work)."""
    return WorkerInfo(
        model_config=SMOLLM2_135M.model_copy(update={"name": f"limits-{uuid.uuid4().hex[:6]}"}),
        max_parallel_requests=1,
        backend_kind="fake",
    )


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP response with a Content-Length (what every answer here has)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def request(path: str = "/health", extra: bytes = b"") -> bytes:
    return b"GET " + path.encode() + b" HTTP/1.1\r\nHost: test\r\n" + extra + b"\r\n"


def trickle(sock: socket.socket, data: bytes, per_second: float) -> int:
    """Send ``data`` a byte at a time until the server answers or closes; how many bytes went out."""
    sock.setblocking(False)
    sent = 0
    try:
        for byte in data:
            try:
                if sock.recv(1, socket.MSG_PEEK):
                    break  # an answer is waiting
            except BlockingIOError:
                pass
            except ConnectionResetError:
                break
            try:
                sock.send(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += 1
            time.sleep(1 / per_second)
    finally:
        sock.settimeout(30)
    return sent


def assert_json_refusal(status: int, headers: dict[str, str], body: bytes, expected: int, code: str) -> None:
    assert status == expected, body
    assert headers["connection"] == "close"
    assert headers["content-type"].startswith("application/json")
    assert json.loads(body)["code"] == code


# ---------------------------------------------------------------- the head's deadline


def test_a_slowloris_client_is_answered_408_and_closed_within_the_bound(server):
    head = request("/health", b"X-Padding: " + b"p" * 200 + b"\r\n")
    sock = server.connect()
    # 10 bytes a second: the head would take 20 seconds and more; the bound is 2.
    sent = trickle(sock, head, per_second=10)
    assert sent < len(head) // 2, sent
    assert_json_refusal(*read_response(sock), 408, "request_header_timeout")
    assert closed_by_server(sock)
    sock.close()


def test_a_connection_that_sends_nothing_is_closed(server):
    sock = server.connect()
    assert_json_refusal(*read_response(sock), 408, "request_header_timeout")
    assert closed_by_server(sock)
    sock.close()


def test_each_later_request_on_a_connection_has_its_own_deadline(server):
    sock = server.connect()
    for _ in range(3):  # a keep-alive connection: requests in a row, over more than the bound in all
        sock.sendall(request())
        status, headers, _ = read_response(sock)
        assert status == 200 and headers.get("connection") != "close"
        time.sleep(HEADER_TIMEOUT * 0.6)
    # The next request trickles in: its deadline started with its first byte.
    sent = trickle(sock, request("/health", b"X-Padding: " + b"p" * 200 + b"\r\n"), per_second=10)
    assert sent < 150
    assert_json_refusal(*read_response(sock), 408, "request_header_timeout")
    sock.close()


# ---------------------------------------------------------------- the head's size


def test_a_head_over_the_bound_is_answered_431_and_closed(server):
    sock = server.connect()
    sock.sendall(request("/health", b"X-Big: " + b"b" * (MAX_HEADER_BYTES + 10) + b"\r\n"))
    assert_json_refusal(*read_response(sock), 431, "request_header_too_large")
    assert closed_by_server(sock)
    sock.close()
    # A head that never ends (20 MB of one header) is cut off after the bound, not read whole.
    sock = server.connect()
    endless = b"GET /health HTTP/1.1\r\nHost: test\r\nX-Endless: " + b"e" * 20_000_000
    sent = 0
    try:
        while sent < len(endless):
            sent += sock.send(endless[sent : sent + 65536])
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert sent < len(endless)
    sock.close()
    # A long URL counts as the head too.
    sock = server.connect()
    sock.sendall(request("/health?" + "q" * (MAX_HEADER_BYTES + 10)))
    assert_json_refusal(*read_response(sock), 431, "request_header_too_large")
    sock.close()


# ---------------------------------------------------------------- what is not touched


def test_normal_clients_long_responses_and_websockets_are_untouched(server):
    # Ordinary requests, a head just under the bound among them, over one kept-alive connection.
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for index in range(10):
            padding = "p" * (MAX_HEADER_BYTES - 512) if index == 5 else "p"
            assert client.get("/health", headers={"X-Padding": padding}).status_code == 200
            time.sleep(0.3)
        user = client.get("/auth/callback/debug", params={"code": f"u-{uuid.uuid4().hex[:8]}"}).json()
        headers = {"Authorization": f"Bearer {user['access_token']['access_token']}"}
        assert client.post("/chats", json={}, headers=headers).status_code == 200

    async def worker_socket() -> int:
        # A worker's socket lives far longer than the head's deadline: it is not cut.
        info = own_worker_info()
        pings = 0
        async with connect(
            f"ws://127.0.0.1:{server.port}/workers/work", additional_headers=WORKER_HEADERS
        ) as ws:
            await ws.send(dump_frame(info))
            deadline = time.monotonic() + HEADER_TIMEOUT * 2.5
            while time.monotonic() < deadline:
                frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
                if frame["type"] == "ping":
                    pings += 1
                    await ws.send(json.dumps({"type": "pong", "ping_id": frame["ping_id"], "free_slots": 1}))
        return pings

    assert asyncio.run(worker_socket()) >= 2


@pytest.mark.parametrize("head", ["slow", "large"])
def test_a_late_or_large_pipelined_head_lets_the_answer_in_flight_finish_then_closes(server, head):
    """A client that pipelines a request behind its own event stream and sends that request's head
    slowly, or too much of it: the stream goes on to its end, untouched, and then the connection
    closes."""

    async def scenario() -> bytes:
        info = own_worker_info()
        async with connect(
            f"ws://127.0.0.1:{server.port}/workers/work", additional_headers=WORKER_HEADERS
        ) as ws:
            await ws.send(dump_frame(info))
            await asyncio.to_thread(wait_for_model, server.url, info.model_config_.name)
            api = ChatApi(server.url, f"user-{uuid.uuid4().hex[:8]}")
            chat_id = api.create_chat()
            prompter = api.prompter(chat_id, "a question")
            answer = api.assistant(chat_id, prompter.json()["id"], info.model_config_.name, max_new_tokens=8)
            message_id = answer.json()["id"]
            while (frame := json.loads(await asyncio.wait_for(ws.recv(), 10)))["type"] != "work":
                if frame["type"] == "ping":
                    await ws.send(json.dumps({"type": "pong", "ping_id": frame["ping_id"], "free_slots": 0}))
            # The stream, then a second request's head, a few bytes a second, on the same connection.
            sock = server.connect()
            sock.sendall(
                b"GET /chats/%s/messages/%s/events HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer %s\r\n\r\n"
                % (chat_id.encode(), message_id.encode(), api.token.encode())
            )
            padding = 200 if head == "slow" else MAX_HEADER_BYTES * 2
            pipelined = request("/health", b"X-Padding: " + b"p" * padding + b"\r\n")
            received = b""
            sock.setblocking(False)
            deadline = time.monotonic() + HEADER_TIMEOUT * 2.5
            sent = 0
            while time.monotonic() < deadline:
                step = 1 if head == "slow" else MAX_HEADER_BYTES // 2  # "large": past the bound in 3 reads
                if sent < len(pipelined) - 10:  # never the whole head
                    try:
                        sent += sock.send(pipelined[sent : sent + step])
                    except BlockingIOError:
                        pass
                await asyncio.sleep(0.1)
                try:
                    received += sock.recv(65536)
                except BlockingIOError:
                    pass
            after_deadline = len(received)
            # The stream is still open past the head's deadline; now the answer ends it.
            await asyncio.sleep(1.5)
            try:
                received += sock.recv(65536)
            except BlockingIOError:
                pass
            assert len(received) > after_deadline, received[-300:]  # still streaming (pings)
            result = GeneratedText(
                message_id=message_id, text="an answer", finish_reason="eos_token", generated_tokens=2
            )
            await ws.send(dump_frame(result))
            sock.settimeout(30)
            while chunk := sock.recv(65536):
                received += chunk
            sock.close()
            return received

    received = asyncio.run(scenario())
    assert received.startswith(b"HTTP/1.1 200 OK")
    assert b'"event_type":"message"' in received and b"an answer" in received
    stream = received.split(b"\r\n\r\n", 1)[1]
    # Nothing was written into the stream: no refusal's status line or body (ids and data carry digits
    # that may spell 408 or 431, so the check looks for the refusal itself).
    assert b"HTTP/1.1" not in stream, stream[-300:]
    assert b"request_header_timeout" not in stream and b"request_header_too_large" not in stream


# ---------------------------------------------------------------- the connection cap


def test_past_the_cap_new_connections_get_503_and_the_open_ones_keep_working(server):
    # Open connections each hold a request in progress (its body not all sent yet): a POST with a
    # 64-byte body, 1 byte of which has arrived.
    body = json.dumps({"refresh_token": "r" * 40}).encode().ljust(64)
    head = (
        b"POST /auth/refresh HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    held: list[socket.socket] = []
    refused = None
    try:
        # Every process must be full before a connection is refused for certain: at most one more
        # connection than the processes' caps together.
        for _ in range(MAX_CONNECTIONS * server.processes + 1):
            sock = server.connect()
            sock.sendall(head + body[:1])
            sock.settimeout(0.5)
            try:
                answer = sock.recv(65536, socket.MSG_PEEK)
            except TimeoutError:
                answer = b""
            sock.settimeout(30)
            if answer:  # answered at once: refused
                refused = sock
                break
            held.append(sock)
        assert refused is not None, f"{len(held)} connections open, none refused"
        status, headers, payload = read_response(refused)
        assert_json_refusal(status, headers, payload, 503, "too_many_connections")
        assert headers["retry-after"] == "1"
        assert closed_by_server(refused)
        refused.close()
        # Over the cap, a websocket is refused the same way.
        if server.processes == 1:

            async def websocket() -> int:
                with pytest.raises(InvalidStatus) as refusal:
                    await connect(
                        f"ws://127.0.0.1:{server.port}/workers/work", additional_headers=WORKER_HEADERS
                    )
                return refusal.value.response.status_code

            assert asyncio.run(websocket()) == 503
        # The open connections finish their requests: answered as usual (an unknown refresh token).
        for sock in held:
            sock.sendall(body[1:])
            status, _, payload = read_response(sock)
            assert status == 401, payload
            assert json.loads(payload)["code"] == "invalid_refresh_token"
    finally:
        for sock in held:
            sock.close()
    # With the connections closed, new ones are served again.
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{server.url}/health", timeout=10).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, server.process.log_tail()
        time.sleep(0.2)
    log = server.process.log_path.read_text(errors="replace")
    assert "connection(s) refused" in log and "OASST_SERVER_MAX_CONNECTIONS" in log
