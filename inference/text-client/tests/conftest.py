"""A scripted chat server in a thread, for fault injection (drops, stalls, errors) without a model.

It speaks real HTTP on a real socket, so the client's httpx and SSE code run exactly as against the
real server; only the answers are canned. Tests of behaviour with a real model use the root
``embedded_stack`` fixture instead.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Connection:
    """How the fake server treats one request for an event stream (consumed in order, then "ok")."""

    kind: str = "ok"  # ok | eof_after | abort_after | stall_after | status
    after: int = 0  # events sent before the fault
    status: int = 503
    stall_s: float = 5.0


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeChatServer:
    url: str = ""
    models: list[dict[str, Any]] = field(default_factory=list)
    tokens: list[str] = field(default_factory=lambda: ["Hello", ",", " world", "!"])
    token_delay_s: float = 0.0
    final_state: str = "complete"
    error_event: str | None = None  # terminal error event instead of the message event
    retry_after_tokens: int | None = None  # send a worker-lost retry event after this many tokens
    connections: list[Connection] = field(default_factory=list)
    cancel_status: int = 200
    cancel_content: str | None = "Hello"  # the partial text a cancelled message keeps
    requests: list[Recorded] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    login_status: int = 200
    turns: bool = False  # serve POST /chats/{id}/turns, as our server does (the original one does not)

    def events_for(self, message_id: str) -> list[tuple[str, dict[str, Any]]]:
        msg = self.messages[message_id]
        events: list[dict[str, Any]] = [{"event_type": "pending", "queue_position": 1, "queue_size": 2}]
        for i, tok in enumerate(self.tokens):
            if self.retry_after_tokens is not None and i == self.retry_after_tokens:
                events.append({"event_type": "retry", "attempt": 2, "reason": "worker disconnected"})
                events.extend({"event_type": "token", "text": t} for t in self.tokens)
                break
            events.append({"event_type": "token", "text": tok})
        final = dict(msg, content="".join(self.tokens), state=self.final_state, finish_reason="eos_token")
        final["generated_tokens"] = len(self.tokens)
        if self.error_event is not None:
            events.append({"event_type": "error", "error": self.error_event})
        else:
            events.append({"event_type": "message", "message": final})
        return [(f"{i + 1}-0", e) for i, e in enumerate(events)]

    # filled in by the handler
    chats: dict[str, list[str]] = field(default_factory=dict)
    messages: dict[str, dict[str, Any]] = field(default_factory=dict)


def _message(
    chat_id: str, parent_id: str | None, role: str, state: str, content: str | None
) -> dict[str, Any]:
    return {
        "id": str(uuid.uuid4()),
        "chat_id": chat_id,
        "parent_id": parent_id,
        "content": content,
        "created_at": datetime.now(timezone.utc).isoformat(),
        "role": role,
        "state": state,
    }


def _make_handler(state: FakeChatServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
            pass

        def _json(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, detail: str, code: str = "error") -> None:
            self._json(status, {"detail": detail, "code": code})

        def _record(self) -> tuple[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            path = urlparse(self.path).path
            state.requests.append(Recorded(self.command, self.path, dict(self.headers.items()), body))
            return path, body

        def _authorized(self) -> bool:
            if self.headers.get("Authorization", "").startswith("Bearer tok-"):
                return True
            self._error(401, "not authenticated", "unauthorized")
            return False

        def do_GET(self) -> None:
            path, _ = self._record()
            parts = path.strip("/").split("/")
            if path == "/auth/callback/debug":
                user = parse_qs(urlparse(self.path).query).get("code", [""])[0]
                if state.login_status != 200:
                    self._error(state.login_status, "debug login is disabled", "forbidden")
                    return
                self._json(200, {"access_token": {"access_token": f"tok-{user}", "token_type": "bearer"}})
            elif not self._authorized():
                return
            elif path == "/configs/model_configs":
                self._json(200, state.models)
            elif len(parts) == 5 and parts[0] == "chats" and parts[4] == "events":
                self._events(parts[3])
            elif len(parts) == 4 and parts[0] == "chats" and parts[2] == "messages":
                msg = state.messages.get(parts[3])
                self._json(200, msg) if msg else self._error(404, "message not found", "not_found")
            else:
                self._error(404, "Not Found", "not_found")

        def do_POST(self) -> None:
            path, body = self._record()
            if not self._authorized():
                return
            parts = path.strip("/").split("/")
            if path == "/chats":
                chat_id = str(uuid.uuid4())
                state.chats[chat_id] = []
                now = datetime.now(timezone.utc).isoformat()
                self._json(200, {"id": chat_id, "created_at": now, "modified_at": now, "messages": []})
            elif len(parts) == 3 and parts[0] == "chats" and parts[2] == "prompter_message":
                chat = state.chats.get(parts[1])
                if chat is None:
                    self._error(404, "chat not found", "not_found")
                    return
                if body.get("parent_id") is None and chat:
                    self._error(400, "Trying to add first message to non-empty chat", "bad_parent")
                    return
                msg = _message(parts[1], body.get("parent_id"), "prompter", "manual", body["content"])
                state.messages[msg["id"]] = msg
                chat.append(msg["id"])
                self._json(200, msg)
            elif len(parts) == 3 and parts[0] == "chats" and parts[2] == "assistant_message":
                names = [m["name"] for m in state.models]
                if body["model_config_name"] not in names:
                    self._error(422, f"unknown model; available: {', '.join(names)}", "unknown_model")
                    return
                msg = _message(parts[1], body["parent_id"], "assistant", "pending", None)
                msg["sampling_parameters"] = body.get("sampling_parameters")
                state.messages[msg["id"]] = msg
                state.chats[parts[1]].append(msg["id"])
                self._json(200, msg)
            elif len(parts) == 3 and parts[0] == "chats" and parts[2] == "turns" and state.turns:
                chat = state.chats.get(parts[1])
                if chat is None:
                    self._error(404, "chat not found", "chat_not_found")
                    return
                names = [m["name"] for m in state.models]
                if body["model_config_name"] not in names:
                    self._error(400, f"unknown model; available: {', '.join(names)}", "unknown_model")
                    return
                prompt = _message(parts[1], body.get("parent_id"), "prompter", "manual", body["content"])
                answer = _message(parts[1], prompt["id"], "assistant", "pending", None)
                answer["sampling_parameters"] = body.get("sampling_parameters")
                for msg in (prompt, answer):
                    state.messages[msg["id"]] = msg
                    chat.append(msg["id"])
                created = {"event_type": "created", "prompter_message": prompt, "assistant_message": answer}
                self._events(answer["id"], lead=created)
            elif len(parts) == 5 and parts[2] == "messages" and parts[4] == "cancel":
                state.cancelled.append(parts[3])
                if state.cancel_status == 409:
                    # The answer finished before the cancel arrived: the real server's 409.
                    msg = state.messages[parts[3]]
                    msg.update(state="complete", content="".join(state.tokens))
                    self._error(409, "the message has already finished", "conflict")
                elif state.cancel_status != 200:
                    self._error(state.cancel_status, "Method Not Allowed", "method_not_allowed")
                else:
                    msg = state.messages[parts[3]]
                    if msg["state"] in ("pending", "in_progress"):
                        msg.update(state="cancelled", content=state.cancel_content)
                    self._json(200, msg)
            else:
                self._error(404, "Not Found", "not_found")

        def _events(self, message_id: str, lead: dict[str, Any] | None = None) -> None:
            if message_id not in state.messages:
                self._error(404, "message not found", "not_found")
                return
            conn = state.connections.pop(0) if state.connections else Connection()
            if conn.kind == "status":
                self._error(conn.status, "temporarily unavailable", "unavailable")
                return
            events = state.events_for(message_id)
            last_id = self.headers.get("Last-Event-ID")
            if last_id is not None:
                ids = [eid for eid, _ in events]
                events = events[ids.index(last_id) + 1 :]
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            if conn.kind != "ok":
                # This connection will be cut: say so, or the client may reuse it and fail once more.
                self.send_header("Connection", "close")
            self.end_headers()
            self._chunk(b": ping\r\n\r\n")
            if lead is not None:
                self._chunk(f"data: {json.dumps(lead)}\n\n".encode())
            for sent, (eid, event) in enumerate(events):
                if conn.kind != "ok" and sent == conn.after:
                    if conn.kind == "abort_after":
                        # Half an event, then a connection reset in the middle of the chunked body.
                        self.wfile.write(b'40\r\nid: 99\r\ndata: {"event_ty')
                        self.wfile.flush()
                        self.connection.shutdown(socket.SHUT_RDWR)
                        self.close_connection = True
                        return
                    if conn.kind == "eof_after":
                        self._chunk(b"")
                        self.close_connection = True
                        return
                    if conn.kind == "stall_after":
                        time.sleep(conn.stall_s)
                        self.close_connection = True
                        return
                if event["event_type"] == "token" and state.token_delay_s:
                    time.sleep(state.token_delay_s)
                self._chunk(f"id: {eid}\ndata: {json.dumps(event)}\n\n".encode())
            self._chunk(b"")

        def _chunk(self, data: bytes) -> None:
            try:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

    return Handler


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # Connections the tests cut on purpose end in socket errors; they are not failures.
        pass


@pytest.fixture
def fake_server() -> Iterator[FakeChatServer]:
    state = FakeChatServer(
        models=[
            {
                "name": "fake-model",
                "model_id": "fake/model",
                "description": "a canned answer",
                "max_input_length": 1024,
                "max_total_length": 2048,
                "parameter_configs": [
                    {"name": "default", "sampling_parameters": {"temperature": 0.7, "max_new_tokens": 64}}
                ],
                "worker_count": 1,
            },
            {
                "name": "other-model",
                "model_id": "fake/other",
                "max_input_length": 1024,
                "max_total_length": 2048,
                "worker_count": 2,
            },
        ]
    )
    server = _QuietServer(("127.0.0.1", 0), _make_handler(state))
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def closed_port_url() -> str:
    """A URL on which nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def client_env(tmp_path: Path) -> dict[str, str]:
    """Environment for running oasst-chat as a subprocess: no stray settings, a private HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OASST_")}
    env.update(HOME=str(tmp_path), XDG_STATE_HOME=str(tmp_path / "state"), PYTHONUNBUFFERED="1")
    env.update(TERM="xterm", PROMPT_TOOLKIT_NO_CPR="1", COLUMNS="200", LINES="50")
    return env


@pytest.fixture
def chat_command() -> list[str]:
    return [sys.executable, "-m", "oasst_text_client"]
