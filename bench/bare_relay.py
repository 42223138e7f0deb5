"""The bare relay: the least a Python proxy of the instant backend can be, as a yardstick for ours.

A plain FastAPI app in one uvicorn process that forwards ``POST /v1/chat/completions`` to the backend with
one shared ``httpx.AsyncClient`` and streams the backend's bytes back as they come: no authentication,
database, queue or parsing. What it adds to the first token, and the tokens it relays per CPU-second,
are the floor of what a relay written with the same libraries as ours can reach on this machine.

    python -m bench.bare_relay --port 8012 --backend http://127.0.0.1:8011
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from bench.instant_backend import serve


def create_app(backend_url: str) -> FastAPI:
    client: httpx.AsyncClient | None = None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        nonlocal client
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=1000)
        client = httpx.AsyncClient(base_url=backend_url, timeout=httpx.Timeout(600.0), limits=limits)
        yield
        await client.aclose()

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        assert client is not None
        body = await request.body()
        headers = {"content-type": "application/json"}
        upstream = client.build_request("POST", "/v1/chat/completions", content=body, headers=headers)
        response = await client.send(upstream, stream=True)
        if response.status_code != 200:
            body = await response.aread()
            await response.aclose()
            return JSONResponse(
                {"error": body.decode(errors="replace")[:500]}, status_code=response.status_code
            )
        return StreamingResponse(
            response.aiter_raw(),
            media_type=response.headers.get("content-type", "text/event-stream"),
            background=BackgroundTask(response.aclose),
        )

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8012)
    parser.add_argument("--backend", required=True, help="the instant backend's URL")
    args = parser.parse_args()
    serve(create_app(args.backend), args.host, args.port)


if __name__ == "__main__":
    main()
