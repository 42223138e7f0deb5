"""A serving object's result as an HTTP response: an :class:`~..openai_api.served.EventStream` as a
``text/event-stream`` response that always closes its generator, an
:class:`~..openai_api.served.Answer` as its body with its headers on the route's ``Response``."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import anyio
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from oasst_inference_server.api.keep_alive import KeepAliveSender
from oasst_inference_server.openai_api.served import Answer, EventStream

DEFAULT_KEEP_ALIVE = 15.0  # seconds of silence before a keep-alive comment, outside an app with settings


class EventStreamResponse(StreamingResponse):
    """A ``text/event-stream`` response that always closes its generator, shielded, and says
    ``: keep-alive`` after ``keep_alive`` seconds of silence (:mod:`.keep_alive`; by default the app's
    ``sse_ping_interval``).

    Starlette stops iterating when the client disconnects but leaves closing the generator to the
    garbage collector; closing it here runs its ``finally`` (the cancel) at once.
    """

    def __init__(
        self,
        content: AsyncGenerator[str, None] | AsyncGenerator[bytes, None],
        headers: dict[str, str] | None = None,
        keep_alive: float | None = None,
        status_code: int = 200,  # FastAPI's OpenAPI reads a route's status from its response class's default
    ):
        super().__init__(
            content,
            status_code=status_code,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})},
        )
        self._generator = content
        self.keep_alive = keep_alive

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.keep_alive is None:
            app = scope.get("app")
            settings = getattr(getattr(app, "state", None), "settings", None)
            self.keep_alive = getattr(settings, "sse_ping_interval", DEFAULT_KEEP_ALIVE)
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._generator.aclose()

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        sender = KeepAliveSender(send, self.keep_alive or DEFAULT_KEEP_ALIVE)
        try:
            async for chunk in self.body_iterator:
                await sender.write(chunk.encode(self.charset) if isinstance(chunk, str) else bytes(chunk))
        finally:
            sender.stop()
        await sender.finish()


def respond(served: Answer[Any] | EventStream, response: Response) -> Any:
    """What the route returns: the stream's response, or the answer's body (FastAPI serializes it with
    the route's ``response_model`` and adds the headers set on ``response``)."""
    if isinstance(served, EventStream):
        return EventStreamResponse(served.events, headers=served.headers)
    response.headers.update(served.headers)
    return served.body
