"""A scripted TGI-compatible backend whose every answer attacks the web page: scripts, event handlers,
frames, javascript: links, a tracking image, a style that hides the page, controls dressed as the
page's own. For the injection test only (a real model cannot be made to write this on demand).

Run: ``python -m tests.web.hostile_backend PORT``. The answer streams in small pieces, so the page
also renders half-written tags while it arrives.
"""

from __future__ import annotations

import asyncio
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.support import fake_backend
from tests.support.fake_backend import _chunk

# Every attack sets window.__pwned (or fetches a /pwned address) if it ever runs.
HOSTILE_ANSWER = """Here is **bold** text, `<b>inline code</b>` and a [safe link](https://example.com/docs).

<script>window.__pwned = "script"</script>

<img src="/pwned.png" onerror="window.__pwned = 'img'">

<iframe src="javascript:window.__pwned='iframe'"></iframe>

<svg onload="window.__pwned='svg'"><circle r="5"></circle></svg>

<a href="javascript:window.__pwned='link'" onclick="window.__pwned='click'">a javascript link</a>

[a markdown javascript link](javascript:window.__pwned='md')

![tracking pixel](http://127.0.0.1:9/pwned-pixel.png)

<div class="msg-actions" id="send">spoofed page controls</div>

<form action="/auth/logout" method="post"><input name="x" value="y"><button>Sign out</button></form>

<style>body { display: none !important; }</style>

<object data="/pwned.swf"></object><embed src="/pwned.swf">

```html
<script>alert("this one is only code")</script>
```
"""


def pieces(text: str, size: int = 6) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


async def generate_stream(request: Request) -> Response:
    await request.body()
    parts = pieces(HOSTILE_ANSWER)

    async def stream():  # type: ignore[no-untyped-def]
        for index, piece in enumerate(parts, start=1):
            final = HOSTILE_ANSWER if index == len(parts) else None
            yield _chunk(index, piece, final=final, reason="eos_token")
            await asyncio.sleep(0.005)

    return StreamingResponse(stream(), media_type="text/event-stream")


# The fault-injection backend's /info, /health and /tokenize; only the answers differ.
app = Starlette(
    routes=[
        Route("/", generate_stream, methods=["POST"]),
        Route("/generate_stream", generate_stream, methods=["POST"]),
        *(r for r in fake_backend.app.routes if getattr(r, "path", "") in ("/info", "/health", "/tokenize")),
    ]
)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
