"""Helpers of the resumable ``/v1`` stream tests: an SDK stream cut by a :class:`CuttingProxy`, and the
rest of it read back with ``Last-Event-ID`` through httpx, as a client without the SDK would."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import openai

from tests.support.cutting_proxy import CuttingProxy
from tests.support.fake_oauth import ServerThread
from tests.support.processes import free_port
from tests.support.sse import sse_events


@dataclass
class SseEvent:
    id: str | None
    data: str


def read_events(response: httpx.Response) -> list[SseEvent]:
    """Every event of an SSE response (comments skipped), until the stream ends."""
    return [SseEvent(event_id, data) for event_id, data in sse_events(response.iter_lines())]


def text_of(events: list[SseEvent], chat: bool = True) -> str:
    """The answer's text in chunk events (``[DONE]`` and error events have none)."""
    parts: list[str] = []
    for event in events:
        if event.data == "[DONE]":
            continue
        chunk: dict[str, Any] = json.loads(event.data)
        for choice in chunk.get("choices") or []:
            parts.append((choice["delta"].get("content") or "") if chat else (choice.get("text") or ""))
    return "".join(parts)


@contextmanager
def cutting_proxy(upstream: str, events: int) -> Iterator[tuple[CuttingProxy, str]]:
    """A proxy in front of ``upstream`` cutting the first event stream after ``events`` events; its URL."""
    proxy = CuttingProxy(upstream, events=events)
    port = free_port()
    with ServerThread(proxy.app(), port):
        yield proxy, f"http://127.0.0.1:{port}"


@dataclass
class CutStream:
    completion_id: str
    text: str  # what the client received before the cut
    last_event_id: str


def cut_chat_stream(proxy: CuttingProxy, client: openai.OpenAI, **request: Any) -> CutStream:
    """A streamed chat completion through ``proxy``, read with the SDK until the proxy holds, then cut."""
    stream = client.chat.completions.create(stream=True, **request)
    chunks = iter(stream)
    text, completion_id = "", ""
    for _ in range(proxy.events):
        chunk = next(chunks)
        completion_id = chunk.id
        text += "".join(choice.delta.content or "" for choice in chunk.choices)
    assert proxy.holding.wait(30), "the proxy did not relay the events"
    proxy.cut()
    try:
        for chunk in chunks:
            text += "".join(choice.delta.content or "" for choice in chunk.choices)
    except (httpx.HTTPError, openai.APIError):
        pass  # the connection dropped, as it was meant to
    else:
        raise AssertionError("the stream was not cut")
    finally:
        stream.close()
    return CutStream(completion_id, text, proxy.relayed_ids[-1])


def resume(
    base_url: str, key: str, path: str, completion_id: str, last_event_id: str | None
) -> httpx.Response:
    """``GET /v1/{path}/{id}/stream`` with ``Last-Event-ID``, read to its end."""
    headers = {"Authorization": f"Bearer {key}"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    with httpx.Client(base_url=base_url, timeout=120) as http:
        with http.stream("GET", f"/v1/{path}/{completion_id}/stream", headers=headers) as response:
            response.read()
            return response
