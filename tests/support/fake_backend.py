"""A scripted TGI-compatible backend for fault injection only (errors, stalls, drops, slow streams).

Run: ``python tests/support/fake_backend.py PORT``. What it does depends on a marker in the prompt:

* ``[[slow]]``   one token every 50 ms, up to max_new_tokens (for cancel and kill tests)
* ``[[stall]]``  two tokens, then silence
* ``[[drop]]``   three tokens, then the connection is cut
* ``[[error]]``  a 500 generation error before any token
* ``[[invalid]]`` a 422 validation error (not retryable)
* ``[[busy]]``   a 429 overloaded error (the backend has no room: not the message's fault)
* ``[[nul]]``    three tokens, the second holding a NUL character (text no frame may carry)
* ``[[huge]]``   max_new_tokens tokens of 2,000 characters each (an answer over the frame limit)
* ``[[linger]]`` a whole answer, then the response stays open (it never ends after its last event)
* ``[[die]]``    one token, then the whole process exits (a backend that crashes on a poison request)
* otherwise     ``max_new_tokens`` tokens at once, then eos

``GET /stats`` reports how many streams started, finished and were disconnected by the client;
``GET /prompts`` the prompts it was sent (their first 200 characters, the last 100).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
STATS = {"started": 0, "finished": 0, "disconnected": 0, "active": 0}
PROMPTS: list[str] = []


def _chunk(index: int, text: str, final: str | None = None, reason: str = "length") -> bytes:
    payload: dict[str, object] = {
        "index": index,
        "token": {"id": index, "text": text, "logprob": -0.1, "special": False},
        "generated_text": final,
        "details": None
        if final is None
        else {"finish_reason": reason, "generated_tokens": index, "seed": None},
    }
    return b"data:" + json.dumps(payload).encode() + b"\n\n"


async def generate_stream(request: Request) -> Response:
    body = await request.json()
    prompt: str = body.get("inputs", "")
    max_new = int((body.get("parameters") or {}).get("max_new_tokens") or 20)
    PROMPTS.append(prompt[:200])
    del PROMPTS[:-100]
    if "[[error]]" in prompt:
        return JSONResponse({"error": "scripted failure", "error_type": "generation"}, status_code=500)
    if "[[invalid]]" in prompt:
        return JSONResponse(
            {"error": "scripted validation error", "error_type": "validation"}, status_code=422
        )
    if "[[busy]]" in prompt:
        return JSONResponse({"error": "scripted overload", "error_type": "overloaded"}, status_code=429)

    async def stream():  # type: ignore[no-untyped-def]
        STATS["started"] += 1
        STATS["active"] += 1
        try:
            if "[[stall]]" in prompt:
                for i in range(2):
                    yield _chunk(i + 1, f" s{i}")
                await asyncio.sleep(3600)
            if "[[die]]" in prompt:
                yield _chunk(1, " x")
                await asyncio.sleep(0.1)  # the token reaches the worker first: it dies mid-answer
                os._exit(3)
            if "[[drop]]" in prompt:
                for i in range(3):
                    yield _chunk(i + 1, f" d{i}")
                raise ConnectionResetError("scripted drop")
            if "[[nul]]" in prompt:
                yield _chunk(1, " n1")
                yield _chunk(2, " n\u0000")
                yield _chunk(3, " n3", final=" n1 n\u0000 n3")
                STATS["finished"] += 1
                return
            delay = 0.05 if "[[slow]]" in prompt else 0.0
            text = ""
            for i in range(1, max_new + 1):
                piece = f" {'h' * 1999}" if "[[huge]]" in prompt else f" w{i}"
                text += piece
                if i == max_new:
                    # A huge answer's full text would be one SSE line past the client's line limit.
                    yield _chunk(i, piece, final="" if "[[huge]]" in prompt else text, reason="length")
                else:
                    yield _chunk(i, piece)
                if delay:
                    await asyncio.sleep(delay)
            STATS["finished"] += 1
            if "[[linger]]" in prompt:
                await asyncio.sleep(3600)
        except asyncio.CancelledError:
            STATS["disconnected"] += 1
            raise
        finally:
            STATS["active"] -= 1

    return StreamingResponse(stream(), media_type="text/event-stream")


async def info(_request: Request) -> Response:
    return JSONResponse(
        {"model_id": "fake", "max_input_length": 1000, "max_total_tokens": 2000, "chat_template": CHATML}
    )


async def health(_request: Request) -> Response:
    return Response(status_code=200)


async def tokenize(request: Request) -> Response:
    text = (await request.json()).get("inputs", "")
    return JSONResponse([{"id": i, "text": w, "start": 0, "stop": 0} for i, w in enumerate(text.split())])


async def stats(_request: Request) -> Response:
    return JSONResponse(STATS)


async def prompts(_request: Request) -> Response:
    return JSONResponse(PROMPTS)


app = Starlette(
    routes=[
        Route("/", generate_stream, methods=["POST"]),
        Route("/generate_stream", generate_stream, methods=["POST"]),
        Route("/info", info),
        Route("/health", health),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/stats", stats),
        Route("/prompts", prompts),
    ]
)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
