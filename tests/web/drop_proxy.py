"""A reverse proxy between the browser and the server that cuts an answer's event stream mid-way:
the network fault of the resume test, injected at the one place a browser cannot fake it.

Every request is relayed unchanged. The first event stream (a turn's ``POST .../turns``, or an
answer's ``.../events``) is relayed for a few ``token`` events, then held until the test calls
``cut()``, which aborts that connection as a dropped network would. The stream the page reconnects with is relayed up to its terminal event,
which is held until ``release()``: the test can look at the streamed text before the final event
could correct it. Later streams pass through.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
from starlette.applications import Starlette
from starlette.requests import Request

from tests.support.relay_proxy import StreamCut, relay_app

_TERMINAL = ('"event_type":"message"', '"event_type":"error"')


@dataclass
class EventsRequest:
    method: str
    path: str
    last_event_id: str | None
    relayed_ids: list[str] = field(default_factory=list)


@dataclass
class DropProxy:
    upstream: str
    tokens_before_cut: int = 3
    url: str = ""
    requests: list[EventsRequest] = field(default_factory=list)
    holding: threading.Event = field(default_factory=threading.Event)  # the first stream waits for cut()
    holding_terminal: threading.Event = field(default_factory=threading.Event)
    _cut: threading.Event = field(default_factory=threading.Event)
    _release: threading.Event = field(default_factory=threading.Event)

    def cut(self) -> None:
        self._cut.set()

    def release(self) -> None:
        self._release.set()

    def app(self) -> Starlette:
        return relay_app(self.upstream, self._tap_events)

    def _tap_events(
        self, request: Request, response: httpx.Response, body: AsyncIterator[bytes]
    ) -> AsyncIterator[bytes]:
        path = request.url.path
        if path.endswith(("/events", "/turns")) and response.status_code == 200:
            record = EventsRequest(request.method, path, request.headers.get("last-event-id"))
            return self._tap(body, record)
        return body

    async def _wait(self, flag: threading.Event) -> None:
        while not flag.is_set():
            await asyncio.sleep(0.02)

    async def _tap(self, body: AsyncIterator[bytes], record: EventsRequest) -> AsyncIterator[bytes]:
        """Relay SSE events one by one, cutting or holding as the module docstring says."""
        self.requests.append(record)
        stream_number = len(self.requests)
        buffer, tokens = b"", 0
        async for chunk in body:
            buffer += chunk
            while b"\r\n\r\n" in buffer:
                raw, buffer = buffer.split(b"\r\n\r\n", 1)
                text = raw.decode()
                if stream_number == 2 and any(t in text for t in _TERMINAL):
                    self.holding_terminal.set()
                    await self._wait(self._release)
                yield raw + b"\r\n\r\n"
                for line in text.splitlines():
                    if line.startswith("id: "):
                        record.relayed_ids.append(line[4:])
                tokens += '"event_type":"token"' in text
                if stream_number == 1 and tokens >= self.tokens_before_cut:
                    self.holding.set()
                    await self._wait(self._cut)
                    raise StreamCut("the test cut the connection")
        if buffer:
            yield buffer
