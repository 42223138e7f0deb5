"""The first thing every HTTP request meets: a bounded body of valid text, or a 4xx before anything else.

A pure ASGI middleware (no ``BaseHTTPMiddleware``: it would wrap streaming responses), outside
authentication, routing and body parsing:

- a ``Content-Length`` over ``max_request_body_bytes`` is refused with 413 before a byte is read,
  and so is a body (chunked, or lying about its length) that grows past it while it streams in;
- a body that has not arrived whole within ``body_timeout`` seconds is refused with 408 (a client that
  sends a byte now and then would otherwise hold its connection and its task for ever);
- a JSON body that nests arrays and objects more than ``MAX_JSON_DEPTH`` levels deep is refused with
  422 (400 under ``/v1/``) before it is parsed: past their limits the parsers behind this one fail
  with errors of their own (a ``RecursionError``, a worker frame that cannot be read back);
- text that is not valid Unicode is refused with 422 (400 under ``/v1/``): bytes that are not UTF-8,
  a NUL character, or a JSON ``\\u`` escape of NUL or of a lone surrogate, in the body, the path or
  the query string. Such text would otherwise reach Postgres (which refuses NUL in text) or a worker
  frame (which cannot encode a lone surrogate) and fail far from its cause.

The body is read whole (it is bounded) and handed to the application as one message; later
``receive`` calls go to the server, so disconnect detection of streaming responses still works.
The request head (line and headers) is bounded below this, where uvicorn reads it
(:mod:`.connection_guard`).
"""

from __future__ import annotations

import asyncio
import re
from urllib.parse import unquote_to_bytes

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from oasst_inference_server.api.error_handlers import error_response
from oasst_shared.json_depth import json_depth
from oasst_shared.limits import MAX_JSON_DEPTH

# A backslash escape of a JSON string: \uXXXX captured, any other escape consumed whole so that an
# escaped backslash followed by "u0000" is not mistaken for an escape.
_JSON_ESCAPE = re.compile(rb"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)


def text_problem(data: bytes, *, json_escapes: bool) -> str | None:
    """Why ``data`` is not valid text (None when it is)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "the text is not valid UTF-8"
    if "\x00" in text:
        return "the text holds a NUL character"
    if json_escapes and b"\\" in data:
        pending_high = False  # the previous escape was a high surrogate awaiting its low half
        last_end = -1
        for match in _JSON_ESCAPE.finditer(data):
            hex_digits = match.group(1)
            adjacent = match.start() == last_end
            last_end = match.end()
            code = int(hex_digits, 16) if hex_digits else None
            if pending_high and not (adjacent and code is not None and 0xDC00 <= code <= 0xDFFF):
                return "the text holds a lone surrogate (\\ud800-\\udfff)"
            if code is None:
                pending_high = False
                continue
            if code == 0:
                return "the text holds a NUL character (\\u0000)"
            if 0xD800 <= code <= 0xDBFF:
                pending_high = True
            elif 0xDC00 <= code <= 0xDFFF and not pending_high:
                return "the text holds a lone surrogate (\\ud800-\\udfff)"
            else:
                pending_high = False
        if pending_high:
            return "the text holds a lone surrogate (\\ud800-\\udfff)"
    return None


def _query_problem(query_string: bytes) -> str | None:
    for pair in query_string.split(b"&"):
        for part in pair.split(b"=", 1):
            problem = text_problem(unquote_to_bytes(part.replace(b"+", b" ")), json_escapes=False)
            if problem:
                return problem.replace("the text", "the query string")
    return None


def _path_problem(scope: Scope) -> str | None:
    raw = scope.get("raw_path") or scope["path"].encode("utf-8", "surrogateescape")
    problem = text_problem(unquote_to_bytes(raw), json_escapes=False)
    return problem.replace("the text", "the path") if problem else None


def _content_length(scope: Scope) -> int | None | str:
    """The declared length, None when absent, or "bad" when it is not one non-negative integer."""
    values = [v for k, v in scope.get("headers", ()) if k == b"content-length"]
    if not values:
        return None
    if len(set(values)) != 1 or not values[0].strip().isdigit():
        return "bad"
    return int(values[0])


def _is_json(scope: Scope) -> bool:
    for key, value in scope.get("headers", ()):
        if key == b"content-type":
            return b"json" in value.lower()
    return True  # FastAPI parses an untyped body as JSON too


async def _refuse(scope: Scope, send: Send, status: int, code: str, detail: str) -> None:
    # The rest of an oversized or late body is not read: the connection cannot serve another request.
    response = error_response(scope["path"], status, code, detail, {"Connection": "close"})
    await response(scope, _no_receive, send)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


class EdgeGuard:
    def __init__(self, app: ASGIApp, *, max_body_bytes: int, body_timeout: float) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = _path_problem(scope) or _query_problem(scope.get("query_string", b""))
        if problem:
            await _refuse(scope, send, 422, "invalid_text", problem)
            return
        declared = _content_length(scope)
        if declared == "bad":
            await _refuse(scope, send, 400, "invalid_content_length", "the Content-Length header is invalid")
            return
        if isinstance(declared, int) and declared > self.max_body_bytes:
            await _refuse(scope, send, 413, "request_too_large", self._too_large(declared))
            return
        try:
            async with asyncio.timeout(self.body_timeout):
                body = await self._read_body(receive)
        except TimeoutError:
            detail = (
                f"the request body did not arrive within {self.body_timeout:g} seconds "
                "(OASST_SERVER_REQUEST_BODY_TIMEOUT)"
            )
            await _refuse(scope, send, 408, "request_timeout", detail)
            return
        except _BodyTooLarge as exc:
            await _refuse(scope, send, 413, "request_too_large", self._too_large(exc.size, more=True))
            return
        if body is None:
            return  # the client left before its body arrived: nothing to answer
        if body:
            json_body = _is_json(scope)
            problem = text_problem(body, json_escapes=json_body)
            if problem:
                await _refuse(scope, send, 422, "invalid_text", problem.replace("the text", "the body"))
                return
            depth = json_depth(body) if json_body else 0
            if depth > MAX_JSON_DEPTH:
                detail = f"the body nests arrays and objects {depth} levels deep; this server accepts {MAX_JSON_DEPTH}"
                await _refuse(scope, send, 422, "json_too_deep", detail)
                return
        await self.app(scope, _replay(body, receive), send)

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body, or None if the client disconnected first."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _BodyTooLarge(size)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _too_large(self, size: int, *, more: bool = False) -> str:
        return (
            f"the request body has {'more than ' if more else ''}{size} bytes; "
            f"this server accepts {self.max_body_bytes} (OASST_SERVER_MAX_REQUEST_BODY_BYTES)"
        )


class _BodyTooLarge(Exception):
    def __init__(self, size: int) -> None:
        self.size = size


def _replay(body: bytes, receive: Receive) -> Receive:
    delivered = False

    async def replayed() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
