"""TGI's ``generate_stream`` read by the worker's own client: one pooled aiohttp session per backend, each
event decoded by msgspec into a struct (no pydantic model, no ``json.loads`` per token).

The request is still ``text_generation``'s (its request and parameter models check the parameters as its
``AsyncClient`` does, once per request), and errors are still its errors (``parse_error`` of an error
response or an error event). What differs from ``AsyncClient.generate_stream``:

* the session and its connections are kept open across requests (a new session per request cost a TCP
  connect and a session's setup per answer); a connection goes back to the pool only once its stream
  ended cleanly, and one idle for :data:`KEEPALIVE_SECONDS` is closed first (before uvicorn's five
  seconds close it under a request);
* the stream is read a network read at a time (:class:`SseLines`), not a line at a time: the tokens of
  one read are decoded in one go, and the stall deadline is checked once per read;
* the final event's ``details.cached_tokens`` (the bundled CPU backend's count of the prompt tokens its
  prefix cache served) is kept, which the client's model drops.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import aiohttp
import msgspec
from aiohttp import ClientResponse, ClientTimeout
from text_generation.errors import parse_error
from text_generation.types import Parameters, Request

# Idle pooled connections are closed after this long: under uvicorn's keep-alive timeout (5 s), so the
# backend never closes a connection the worker is just sending a request on.
KEEPALIVE_SECONDS = 3.0
# A line of the stream longer than this is not an event of any backend: the stream is refused.
MAX_LINE_BYTES = 16 * 1024 * 1024


class TgiToken(msgspec.Struct):
    """A token of a stream event (``text_generation.types.Token``)."""

    id: int
    text: str
    special: bool
    logprob: float | None = None


class StreamDetails(msgspec.Struct):
    """The final event's details (``text_generation.types.StreamDetails``, with ``cached_tokens``)."""

    finish_reason: Literal["length", "eos_token", "stop_sequence"]
    generated_tokens: int
    seed: int | None = None
    cached_tokens: Any = None  # checked by :func:`cached_tokens`: a bad value is not an error


class StreamEvent(msgspec.Struct):
    """One event of the stream (``text_generation.types.StreamResponse``)."""

    token: TgiToken
    top_tokens: list[TgiToken] | None = None
    generated_text: str | None = None
    details: StreamDetails | None = None


# strict=False: the lax conversions pydantic's models allowed (an id of "5", a logprob of 1).
_decoder = msgspec.json.Decoder(StreamEvent, strict=False)
_encoder = msgspec.json.Encoder()


def decode_event(data: bytes, status: int) -> StreamEvent:
    """An event's JSON (after ``data:``); an error event (or any other JSON) raises the client's error for
    it, malformed JSON raises ``ValueError``, as ``AsyncClient.generate_stream`` does."""
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError:
        payload = json.loads(data)  # malformed JSON raises here, as it did
        raise parse_error(status, payload) from None


def cached_tokens(details: StreamDetails) -> int | None:
    """The prompt tokens the backend's cache served (the bundled backend's ``details.cached_tokens``;
    TGI does not tell)."""
    value = details.cached_tokens
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class SseLines:
    """Splits a server-sent event stream's bytes into its ``data:`` payloads, a network read at a time."""

    __slots__ = ("_rest",)

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        """The payloads of the complete lines so far (the blank line after each event is skipped)."""
        if self._rest:
            chunk = self._rest + chunk
        lines = chunk.split(b"\n")
        self._rest = lines.pop()
        if len(self._rest) > MAX_LINE_BYTES:
            raise aiohttp.ClientPayloadError(f"a line of the stream is over {MAX_LINE_BYTES} bytes")
        return [line[5:] for line in lines if line.startswith(b"data:")]


def request_body(prompt: str, *, stop_sequences: list[str] | None = None, **parameters: Any) -> bytes:
    """The JSON of ``text_generation``'s streamed request (its models check ``parameters``: the keyword
    arguments of ``AsyncClient.generate_stream``, ``stop_sequences`` as it names them)."""
    request = Request(
        inputs=prompt,
        stream=True,
        parameters=Parameters(
            best_of=None,
            details=True,
            decoder_input_details=False,
            return_full_text=False,
            watermark=False,
            stop=stop_sequences or [],
            **parameters,
        ),
    )
    return request.model_dump_json().encode()


class TgiSession:
    """One backend's pooled HTTP session (made on first use, in the running event loop)."""

    def __init__(self, base_url: str) -> None:
        self._base_url = base_url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    def _get(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_SECONDS)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def post(
        self, path: str, body: bytes, *, headers: dict[str, str] | None, timeout: ClientTimeout
    ) -> ClientResponse:
        """The response to a JSON POST (its headers read; the body is the caller's to read and to
        :func:`finish`)."""
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        return await self._get().post(f"{self._base_url}{path}", data=body, headers=all_headers, timeout=timeout)

    async def post_for_json(self, path: str, payload: object, *, timeout: float) -> object:
        """The JSON a 200 answer to a JSON POST holds; None for any other status, a failed request or a
        body that is not JSON (what the tokenizer's endpoints are asked: the caller does without)."""
        try:
            async with self._get().post(
                f"{self._base_url}{path}",
                data=_encoder.encode(payload),
                headers={"Content-Type": "application/json"},
                timeout=ClientTimeout(total=timeout),
            ) as response:
                if response.status != 200:
                    return None
                return msgspec.json.decode(await response.read())
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, msgspec.DecodeError):
            return None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def finish(response: ClientResponse) -> None:
    """Give the response's connection back to the pool if its body was read to the end, else close it
    (a stream left early: closing it tells the backend to stop generating)."""
    if response.content.at_eof():
        response.release()
    else:
        response.close()
