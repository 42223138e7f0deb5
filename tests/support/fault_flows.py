"""Chat flows the fault tests share: a fresh user, a queued answer, its final event, a state to wait
for, and a private redis-server to flush or restart."""

from __future__ import annotations

import subprocess
import time
import uuid

import redis

from tests.e2e.chat_api import ChatApi


def new_api(stack) -> ChatApi:
    return ChatApi(stack.url, f"user-{uuid.uuid4().hex[:8]}")


def queue(api: ChatApi, model: str, content: str, **sampling):
    chat_id = api.create_chat()
    prompter = api.prompter(chat_id, content)
    prompter.raise_for_status()
    response = api.assistant(chat_id, prompter.json()["id"], model, **sampling)
    assert response.status_code == 200, response.text
    return chat_id, response.json()["id"]


def final_of(events):
    assert events, "no events"
    kinds = [e.data["event_type"] for e in events]
    assert kinds.count("message") + kinds.count("error") == 1 and kinds[-1] in ("message", "error")
    return events[-1].data


def wait_state(api: ChatApi, chat_id: str, message_id: str, states: set[str], timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = api.client.get(f"/chats/{chat_id}/messages/{message_id}").json()
        if message["state"] in states:
            return message
        time.sleep(0.2)
    raise AssertionError(f"message stayed {message['state']}, expected {states}")


def start_redis(port: int):
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL
    )
    with redis.Redis(port=port) as client:
        for _ in range(100):
            try:
                client.ping()
                return proc
            except redis.ConnectionError:
                time.sleep(0.1)
    raise RuntimeError("redis-server did not start")
