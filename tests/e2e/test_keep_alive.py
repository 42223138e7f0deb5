"""Silent event streams say ``: keep-alive`` (a comment line, which clients ignore) after each
``sse_ping_interval`` of silence, so that a proxy with a read timeout does not drop a held stream; the
events themselves are unchanged. A real server (SQLite, the in-process broker) and a scripted worker on
a real websocket that sends a job's first token, then holds it until the client has read two keep-alive
comments, then finishes it; a real client reads each stream's raw lines: ``/v1/chat/completions``, the
chat API's turn stream, Anthropic's ``/v1/messages`` and ``/v1/responses``."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from oasst_shared.protocol import GeneratedText, Token, WorkerInfo, dump_frame
from tests.support.processes import wait_for_model
from tests.support.scripted_worker import ScriptedWorker
from tests.support.stacks import Stack, start_stack
from tests.support.worker_socket import model_config

pytestmark = pytest.mark.slow

KEEP_ALIVE = ": keep-alive"
UNUSED_BACKEND = "http://127.0.0.1:9"  # the worker here is scripted: no backend


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir: Path = tmp_path_factory.mktemp("keep-alive")
    stack = start_stack(
        log_dir,
        UNUSED_BACKEND,
        f"sqlite+aiosqlite:///{log_dir}/oasst.db",
        None,
        workers=0,
        OASST_SERVER_SSE_PING_INTERVAL="0.2",
    )
    yield stack
    stack.stop()


def request_of(kind: str, model: str, chat_id: str | None) -> tuple[str, dict[str, Any]]:
    messages = {
        "model": model,
        "messages": [{"role": "user", "content": "Hold me."}],
        "stream": True,
        "max_tokens": 16,
    }
    if kind == "openai":
        return "/v1/chat/completions", messages
    if kind == "anthropic":
        return "/v1/messages", messages
    if kind == "responses":
        return "/v1/responses", {"model": model, "input": "Hold me.", "stream": True, "max_output_tokens": 16}
    return f"/chats/{chat_id}/turns", {"content": "Hold me.", "model_config_name": model}


async def held_job(worker: ScriptedWorker, comments_read: asyncio.Event) -> None:
    """The job's first token at once, the rest once the client has read the keep-alive comments."""
    work = await worker.next("work")
    message_id = work["message_id"]
    await worker.ws.send(dump_frame(Token(message_id=message_id, text="first ")))
    await comments_read.wait()
    await worker.ws.send(dump_frame(Token(message_id=message_id, text="second")))
    done = GeneratedText(
        message_id=message_id, text="first second", finish_reason="eos_token", generated_tokens=2
    )
    await worker.ws.send(dump_frame(done))


@pytest.mark.parametrize("kind", ["openai", "chat", "anthropic", "responses"])
async def test_a_held_stream_gets_keep_alive_comments_and_its_events_unchanged(
    server: Stack, kind: str
) -> None:
    model = f"keep-alive-{uuid.uuid4().hex[:6]}"
    info = WorkerInfo(model_config=model_config(model), max_parallel_requests=1, backend_kind="fake")
    worker = await ScriptedWorker.connect(server.ws_url, info)
    comments_read = asyncio.Event()
    job = asyncio.create_task(held_job(worker, comments_read))
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            login = await http.get("/auth/callback/debug", params={"code": f"user-{uuid.uuid4().hex[:8]}"})
            login.raise_for_status()
            http.headers["Authorization"] = f"Bearer {login.json()['access_token']['access_token']}"
            await asyncio.to_thread(wait_for_model, server.url, model)
            chat_id = None
            if kind == "chat":
                created = await http.post("/chats", json={})
                created.raise_for_status()
                chat_id = created.json()["id"]
            path, body = request_of(kind, model, chat_id)
            lines: list[str] = []
            comments_after_first_token = 0
            async with http.stream("POST", path, json=body) as response:
                assert response.status_code == 200, await response.aread()
                async for line in response.aiter_lines():
                    lines.append(line)
                    seen_first = any("first" in text for text in lines if text.startswith("data:"))
                    if line == KEEP_ALIVE and seen_first and not comments_read.is_set():
                        comments_after_first_token += 1
                        if comments_after_first_token == 2:
                            comments_read.set()
        await job
    finally:
        job.cancel()
        await worker.close()
    assert comments_after_first_token == 2
    # Comments are whole lines of their own, and every other line is an event's as without them.
    comments = [line for line in lines if line.startswith(":")]
    assert all(line == KEEP_ALIVE or line.startswith(": pending") for line in comments), comments
    fields = [line for line in lines if line and not line.startswith(":")]
    assert all(line.startswith(("data:", "event:", "id:")) for line in fields), fields
    data = [line[len("data:") :].strip() for line in fields if line.startswith("data:")]
    parsed = [json.loads(text) for text in data if text != "[DONE]"]
    assert parsed, lines
    text = json.dumps(parsed)
    assert "first" in text and "second" in text
    assert kind != "openai" or data[-1] == "[DONE]"
