"""A reverse proxy that drops the connection of an event stream mid-way, as a broken network would.

Everything is relayed unchanged. The first ``text/event-stream`` response is relayed for ``events``
events (each ``data:`` event; comments do not count) and then held until the test calls :meth:`cut`,
which aborts that connection; the ids of the events relayed are in ``relayed_ids``, so the test knows
exactly what its client received. Later streams pass through. Serve it with
:class:`tests.support.fake_oauth.ServerThread`.
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


@dataclass
class CuttingProxy:
    upstream: str
    events: int = 4
    relayed_ids: list[str] = field(default_factory=list)
    holding: threading.Event = field(default_factory=threading.Event)  # set once the events are relayed
    _cut: threading.Event = field(default_factory=threading.Event)
    _streams: int = 0

    def cut(self) -> None:
        self._cut.set()

    def app(self) -> Starlette:
        return relay_app(self.upstream, self._tap)

    def _tap(
        self, _request: Request, response: httpx.Response, body: AsyncIterator[bytes]
    ) -> AsyncIterator[bytes]:
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            self._streams += 1
            if self._streams == 1:
                return self._cut_after(body)
        return body

    async def _cut_after(self, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        buffer, relayed = b"", 0
        async for chunk in body:
            buffer += chunk.replace(b"\r\n", b"\n")
            while b"\n\n" in buffer:
                raw, buffer = buffer.split(b"\n\n", 1)
                yield raw + b"\n\n"
                lines = raw.decode().splitlines()
                self.relayed_ids.extend(line[4:] for line in lines if line.startswith("id: "))
                relayed += any(line.startswith("data:") for line in lines)
                if relayed >= self.events:
                    self.holding.set()
                    while not self._cut.is_set():
                        await asyncio.sleep(0.02)
                    raise StreamCut("the test cut the connection")
