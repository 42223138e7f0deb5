"""A dishonest backend for compliance tests: a proxy in front of a real TGI-compatible backend (the
bundled CPU backend) that passes everything through but changes one streamed token in ``every``.

It serves in a thread of the test process (:class:`tests.support.fake_oauth.ServerThread`); ``/info``
and ``/health`` pass through unchanged, so a worker in front of it reports the real backend's identity
(the same model id, file hash and build) — as a worker that alters its output would.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

ALTERED_TEXT = " banana"


class AlteringProxy:
    def __init__(self, upstream: str, every: int) -> None:
        self.upstream = upstream.rstrip("/")
        self.every = every
        self.tokens_seen = 0  # every streamed token, for the tests' accounting
        self.altered = 0

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/{path:path}", self._forward, methods=["GET", "POST"])])

    def _alter(self, line: bytes) -> bytes:
        if not line.startswith(b"data:"):
            return line
        payload = json.loads(line[len(b"data:") :])
        token = payload.get("token")
        if isinstance(token, dict):
            self.tokens_seen += 1
            if self.tokens_seen % self.every == 0 and not token.get("special"):
                token["text"] = ALTERED_TEXT
                self.altered += 1
        return b"data:" + json.dumps(payload).encode()

    async def _forward(self, request: Request) -> Response:
        body = await request.body()
        client = httpx.AsyncClient(timeout=httpx.Timeout(300.0))
        upstream = client.build_request(
            request.method,
            f"{self.upstream}{request.url.path}",
            content=body,
            headers={"content-type": request.headers.get("content-type", "application/json")},
        )
        response = await client.send(upstream, stream=True)
        streaming = response.headers.get("content-type", "").startswith("text/event-stream")

        async def lines() -> AsyncIterator[bytes]:
            try:
                if streaming:
                    async for line in response.aiter_lines():
                        yield self._alter(line.encode()) + b"\n"
                else:
                    async for chunk in response.aiter_raw():
                        yield chunk
            finally:
                await response.aclose()
                await client.aclose()

        return StreamingResponse(
            lines(),
            status_code=response.status_code,
            media_type=response.headers.get("content-type"),
        )
