"""A serving object's result as an HTTP response: an :class:`~..openai_api.served.EventStream` as a
``text/event-stream`` response that always closes its generator, an
:class:`~..openai_api.served.Answer` as its body with its headers on the route's ``Response``."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import anyio
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from oasst_inference_server.openai_api.served import Answer, EventStream


class EventStreamResponse(StreamingResponse):
    """A ``text/event-stream`` response that always closes its generator, shielded.

    Starlette stops iterating when the client disconnects but leaves closing the generator to the
    garbage collector; closing it here runs its ``finally`` (the cancel) at once.
    """

    def __init__(self, content: AsyncGenerator[str, None], headers: dict[str, str] | None = None):
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})},
        )
        self._generator = content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._generator.aclose()


def respond(served: Answer[Any] | EventStream, response: Response) -> Any:
    """What the route returns: the stream's response, or the answer's body (FastAPI serializes it with
    the route's ``response_model`` and adds the headers set on ``response``)."""
    if isinstance(served, EventStream):
        return EventStreamResponse(served.events, headers=served.headers)
    response.headers.update(served.headers)
    return served.body
