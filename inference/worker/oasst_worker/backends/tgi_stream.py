"""TGI's ``generate_stream`` read by the worker's own client: one pooled aiohttp session per backend, each
event decoded by msgspec into a struct (no pydantic model, no ``json.loads`` per token).

The request is still ``text_generation``'s (its request and parameter models check the parameters as its
``AsyncClient`` does, once per request), and errors are still its errors (``parse_error`` of an error
response or an error event). What differs from ``AsyncClient.generate_stream``:

* the session and its connections are kept open across requests (:mod:`.pooled_session`);
* the stream is read a network read at a time (:class:`SseLines`), not a line at a time: the tokens of
  one read are decoded in one go, and the stall deadline is checked once per read;
* the final event's ``details.cached_tokens`` (the bundled CPU backend's count of the prompt tokens its
  prefix cache served) is kept, which the client's model drops.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import aiohttp
import msgspec
from text_generation.errors import parse_error
from text_generation.types import Parameters, Request

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


def decode_event(data: bytes, status: int) -> StreamEvent:
    """An event's JSON (after ``data:``); an error event (or any other JSON) raises the client's error for
    it, malformed JSON raises ``json.JSONDecodeError`` (a ``ValueError``), as ``AsyncClient.generate_stream``
    does."""
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError:
        payload = json.loads(data)  # malformed JSON raises here, as it did
        raise answer_error(status, payload) from None


def answer_error(status: int, payload: object) -> Exception:
    """The client's error for an error answer or event (``parse_error``); for one that is not TGI's
    ``{"error": ...}`` (a proxy's page, another server's JSON), the error its status means, with what it
    said (``parse_error`` raises ``KeyError`` or ``TypeError`` on those)."""
    if isinstance(payload, dict) and "error" in payload:
        return parse_error(status, payload)
    return parse_error(status, {"error": f"an unexpected answer: {str(payload)[:200]}"})


def cached_tokens(details: StreamDetails) -> int | None:
    """The prompt tokens the backend's cache served (the bundled backend's ``details.cached_tokens``;
    TGI does not tell)."""
    value = details.cached_tokens
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class SseLines:
    """Splits a server-sent event stream's bytes (TGI's, an OpenAI server's) into its ``data:`` payloads, a network read at a time."""

    __slots__ = ("_rest", "_rest_bytes")

    def __init__(self) -> None:
        # The unfinished line's pieces, joined once it ends: a long line (a final event's whole text)
        # that comes in many reads is copied once, not once per read.
        self._rest: list[bytes] = []
        self._rest_bytes = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        """The payloads of the complete lines so far (the blank line after each event is skipped)."""
        if self._rest:
            self._rest.append(chunk)
            if b"\n" not in chunk:
                self._rest_bytes += len(chunk)
                if self._rest_bytes > MAX_LINE_BYTES:
                    raise _line_too_long()
                return []
            chunk = b"".join(self._rest)
            self._rest = []
        lines = chunk.split(b"\n")
        tail = lines.pop()
        if tail:
            if len(tail) > MAX_LINE_BYTES:
                raise _line_too_long()
            self._rest = [tail]
            self._rest_bytes = len(tail)
        return [line[5:] for line in lines if line.startswith(b"data:")]


def _line_too_long() -> aiohttp.ClientPayloadError:
    return aiohttp.ClientPayloadError(f"a line of the stream is over {MAX_LINE_BYTES} bytes")


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
