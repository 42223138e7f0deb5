"""A reverse proxy that relays every request unchanged, with a hook on each response's body: the base of
the proxies that inject network faults into event streams (``tests/support/cutting_proxy.py``,
``tests/web/drop_proxy.py``). Serve its app with :class:`tests.support.fake_oauth.ServerThread`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

_HOP_BY_HOP = {"host", "connection", "keep-alive", "transfer-encoding", "content-length", "upgrade"}

# (the request, the upstream's response, its body) -> the body to relay.
Tap = Callable[[Request, httpx.Response, AsyncIterator[bytes]], AsyncIterator[bytes]]


class StreamCut(Exception):
    """Raised inside a relayed body: the ASGI server then drops the connection."""


def relay_app(upstream: str, tap: Tap) -> Starlette:
    """An app relaying every request to ``upstream``, each response's body through ``tap``."""
    client: httpx.AsyncClient | None = None

    async def relay(request: Request) -> Response:
        nonlocal client
        client = client or httpx.AsyncClient(timeout=None)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        sent = client.build_request(
            request.method,
            f"{upstream}{request.url.path}",
            params=request.url.query,
            headers=headers,
            content=await request.body(),
        )
        response = await client.send(sent, stream=True)
        body = tap(request, response, response.aiter_raw())

        async def relayed() -> AsyncIterator[bytes]:
            try:
                async for chunk in body:
                    yield chunk
            finally:
                await response.aclose()

        out_headers = {k: v for k, v in response.headers.items() if k.lower() not in _HOP_BY_HOP}
        return StreamingResponse(relayed(), status_code=response.status_code, headers=out_headers)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        if client is not None:  # the proxy's upstream connections close with it
            await client.aclose()

    return Starlette(
        routes=[Route("/{path:path}", relay, methods=["GET", "POST", "PUT", "PATCH", "DELETE"])],
        lifespan=lifespan,
    )
