"""A small synchronous client of the chat API for end-to-end tests (kept apart from the text-client
so each side checks the other)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.support.clients import closing
from tests.support.sse import sse_events


@dataclass
class SseEvent:
    id: str | None
    data: dict[str, Any]


@dataclass
class ChatApi:
    base_url: str
    username: str
    token: str = ""
    client: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.client = closing(httpx.Client(base_url=self.base_url, timeout=120))
        login = self.client.get("/auth/callback/debug", params={"code": self.username})
        login.raise_for_status()
        self.token = login.json()["access_token"]["access_token"]
        self.client.headers["Authorization"] = f"Bearer {self.token}"

    def create_chat(self) -> str:
        response = self.client.post("/chats", json={})
        response.raise_for_status()
        return str(response.json()["id"])

    def prompter(self, chat_id: str, content: str, parent_id: str | None = None) -> httpx.Response:
        return self.client.post(
            f"/chats/{chat_id}/prompter_message", json={"parent_id": parent_id, "content": content}
        )

    def assistant(self, chat_id: str, parent_id: str, model: str, **sampling: Any) -> httpx.Response:
        return self.client.post(
            f"/chats/{chat_id}/assistant_message",
            json={"parent_id": parent_id, "model_config_name": model, "sampling_parameters": sampling},
        )

    def events(
        self, chat_id: str, message_id: str, last_event_id: str | None = None, limit: int | None = None
    ) -> list[SseEvent]:
        """Read the event stream until its terminal event (or ``limit`` events)."""
        out: list[SseEvent] = []
        with contextlib.closing(self.follow(chat_id, message_id, last_event_id)) as events:
            for event in events:
                out.append(event)
                if limit is not None and len(out) >= limit:
                    break
        return out

    def follow(self, chat_id: str, message_id: str, last_event_id: str | None = None) -> Iterator[SseEvent]:
        """The event stream's events as they come, on one connection, until its terminal event (closing the
        iterator closes the connection)."""
        headers = {"Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        with self.client.stream(
            "GET", f"/chats/{chat_id}/messages/{message_id}/events", headers=headers
        ) as response:
            response.raise_for_status()
            for event_id, data in sse_events(response.iter_lines()):
                event = SseEvent(event_id, json.loads(data))
                yield event
                if event.data["event_type"] in ("message", "error"):
                    return

    def ask(self, chat_id: str, content: str, model: str, parent_id: str | None = None, **sampling: Any):
        """Send a prompt, queue an answer, and return (assistant message id, events)."""
        prompter = self.prompter(chat_id, content, parent_id)
        prompter.raise_for_status()
        assistant = self.assistant(chat_id, prompter.json()["id"], model, **sampling)
        assistant.raise_for_status()
        message_id = assistant.json()["id"]
        return message_id, self.events(chat_id, message_id)


def tokens_text(events: list[SseEvent]) -> str:
    text = ""
    for event in events:
        if event.data["event_type"] == "retry":
            text = ""
        elif event.data["event_type"] == "token":
            text += event.data["text"]
    return text
