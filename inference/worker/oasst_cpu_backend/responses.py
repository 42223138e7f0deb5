"""HTTP plumbing: TGI-shaped error bodies, disconnect detection and the server-sent-event response."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from oasst_cpu_backend.schemas import ErrorResponse, ErrorType

# TGI's status codes for its error types.
STATUS_OF_ERROR: dict[ErrorType, int] = {
    "validation": 422,
    "generation": 424,
    "overloaded": 429,
    "incomplete_generation": 500,
}


def error_response(
    message: str, error_type: ErrorType, status_code: int | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = ErrorResponse(error=message, error_type=error_type).model_dump()
    return JSONResponse(body, status_code=status_code or STATUS_OF_ERROR[error_type], headers=headers)


def sse_data(json_text: str) -> bytes:
    # TGI's framing, which the text_generation client parses line by line: no space after "data:", and
    # never a "[DONE]" sentinel (the client would try to parse it as JSON).
    return b"data:" + json_text.encode("utf-8") + b"\n\n"


def sse_error(message: str, error_type: ErrorType) -> bytes:
    return sse_data(ErrorResponse(error=message, error_type=error_type).model_dump_json())


async def wait_for_disconnect(receive: Receive) -> None:
    """Return when the client has gone. Only for use after the request body has been read."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class EventStreamResponse(StreamingResponse):
    """A text/event-stream response that reports a client's departure at once through on_disconnect.

    Starlette's StreamingResponse under uvicorn (ASGI spec 2.3 here, 2.4 elsewhere) may not notice a
    closed connection while the stream has nothing to send, and uvicorn silently drops writes to a closed
    connection; a generation nobody reads would then run to its end and hold the model.
    """

    def __init__(self, events: AsyncIterator[bytes], on_disconnect: Callable[[], None]) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._events = events
        self._on_disconnect = on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def watch() -> None:
            await wait_for_disconnect(receive)
            self._on_disconnect()

        watcher = asyncio.create_task(watch())
        completed = False
        try:
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            async for chunk in self._events:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            completed = True
        finally:
            watcher.cancel()
            aclose = getattr(self._events, "aclose", None)
            if aclose is not None:
                await aclose()
            if not completed:
                self._on_disconnect()
