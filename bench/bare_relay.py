"""The bare relay: the least a Python proxy of the instant backend can be, as a yardstick for ours.

A plain FastAPI app in one uvicorn process that forwards ``POST /v1/chat/completions`` to the backend with
one shared ``httpx.AsyncClient`` and streams the backend's bytes back as they come: no authentication,
database, queue or parsing. What it adds to the first token, and the tokens it relays per CPU-second,
are the floor of what a relay written with the same libraries as ours can reach on this machine.

With ``--upstream tgi`` it is the relay of the issue's yardstick instead: it streams the backend's
text-generation-inference ``/generate_stream`` (the stream our worker reads) and turns each of its events
into an OpenAI chunk: one parse, one encode and one write a token, in one process. At the model's pace
(bench/paced_relay.py) that is the floor of what relaying a token costs.

    python -m bench.bare_relay --port 8012 --backend http://127.0.0.1:8011
    python -m bench.bare_relay --port 8012 --backend http://127.0.0.1:8011 --upstream tgi
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from bench.instant_backend import serve

Upstream = Literal["openai", "tgi"]


def chatml(messages: list[dict[str, Any]]) -> str:
    """The prompt of a conversation in ChatML (SmolLM2's template; the instant backend ignores it)."""
    turns = "".join(f"<|im_start|>{m.get('role')}\n{m.get('content')}<|im_end|>\n" for m in messages)
    return turns + "<|im_start|>assistant\n"


async def tgi_as_openai(response: httpx.Response, model: str) -> AsyncIterator[bytes]:
    """A TGI token stream as OpenAI chat chunks: each event parsed, re-encoded and written on its own."""
    ident = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    created = int(time.time())
    first = True
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        event = json.loads(line[5:])
        token = event.get("token") or {}
        details = event.get("details")
        if not token.get("special"):
            delta = (
                {"role": "assistant", "content": token.get("text", "")}
                if first
                else {"content": token.get("text", "")}
            )
            first = False
            chunk = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": None, "logprobs": None}],
            }
            yield b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
        if details:
            chunk = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [
                    {"index": 0, "delta": {}, "finish_reason": details.get("finish_reason"), "logprobs": None}
                ],
            }
            yield b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


def create_app(backend_url: str, upstream: Upstream = "openai") -> FastAPI:
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
        model = ""
        if upstream == "tgi":
            asked = json.loads(body)
            model = str(asked.get("model", ""))
            parameters = {
                "max_new_tokens": asked.get("max_tokens") or 20,
                "do_sample": bool(asked.get("temperature")),
                "details": True,
            }
            tgi = {"inputs": chatml(asked.get("messages") or []), "parameters": parameters}
            sent = client.build_request("POST", "/generate_stream", json=tgi, headers=headers)
        else:
            sent = client.build_request("POST", "/v1/chat/completions", content=body, headers=headers)
        response = await client.send(sent, stream=True)
        if response.status_code != 200:
            body = await response.aread()
            await response.aclose()
            return JSONResponse(
                {"error": body.decode(errors="replace")[:500]}, status_code=response.status_code
            )
        return StreamingResponse(
            tgi_as_openai(response, model) if upstream == "tgi" else response.aiter_raw(),
            media_type=response.headers.get("content-type", "text/event-stream"),
            background=BackgroundTask(response.aclose),
        )

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8012)
    parser.add_argument("--backend", required=True, help="the instant backend's URL")
    parser.add_argument(
        "--upstream",
        choices=["openai", "tgi"],
        default="openai",
        help="openai: pass the backend's OpenAI stream through; tgi: turn its TGI stream into OpenAI chunks",
    )
    args = parser.parse_args()
    serve(create_app(args.backend, args.upstream), args.host, args.port)


if __name__ == "__main__":
    main()
