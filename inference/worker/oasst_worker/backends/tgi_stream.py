"""TGI's token stream read over one pooled connection, its events decoded by msgspec.

text-generation's ``AsyncClient.generate_stream`` opens an aiohttp session, so a new TCP connection, for
every generation, and builds a pydantic ``StreamResponse`` for every token. :class:`TgiStreamClient`
sends the same request (``text_generation.types.Request`` and ``Parameters``, which check the
parameters as the client does) through one ``aiohttp.ClientSession`` per backend, whose connections are
kept alive between generations, and decodes each ``data:`` line into a :class:`TgiStreamEvent` struct.
Errors are text-generation's own (``text_generation.errors.parse_error``), before the stream and
inside it, so callers map them as they did.

A stream read to its end gives its connection back to the pool; one left early (a cancel, a stop
sequence, an error) closes its connection, so the backend stops generating.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec
from text_generation.errors import parse_error
from text_generation.types import Parameters, Request


class TgiToken(msgspec.Struct):
    id: int
    text: str
    logprob: float | None = None
    special: bool = False


class TgiStreamDetails(msgspec.Struct):
    finish_reason: str
    generated_tokens: int
    seed: int | None = None


class TgiStreamEvent(msgspec.Struct):
    """One ``data:`` line of TGI's stream (its ``StreamResponse``); the last carries ``details``."""

    token: TgiToken
    top_tokens: list[TgiToken] | None = None
    generated_text: str | None = None
    details: TgiStreamDetails | None = None


class MalformedEvent(ValueError):
    """A stream line that is neither an event nor one of TGI's error payloads."""


_decode_event = msgspec.json.Decoder(TgiStreamEvent).decode
# How long the end of a response may lag behind its last event (TGI ends it at once).
_END_OF_RESPONSE_SECONDS = 1.0


class TgiStreamClient:
    def __init__(self, base_url: str, *, timeout: float) -> None:
        self._base_url = base_url
        # A generation's whole time, as text-generation's client bounds it.
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def generate_stream(
        self, prompt: str, *, stop_sequences: list[str] | None = None, **parameters: Any
    ) -> AsyncIterator[TgiStreamEvent]:
        """The events of one generation; ``parameters`` are those of ``AsyncClient.generate_stream``."""
        request = Request(
            inputs=prompt,
            stream=True,
            parameters=Parameters(
                best_of=None,
                details=True,
                decoder_input_details=False,
                stop=stop_sequences or [],
                **parameters,
            ),
        )
        async with self._pool().post(self._base_url, json=request.model_dump(mode="json")) as response:
            if response.status != 200:
                raise parse_error(response.status, await response.json())
            finished = False
            try:
                async for line in response.content:
                    if not line.startswith(b"data:"):
                        continue  # the blank lines between events
                    event = _event(response.status, line[5:])
                    if event is None:
                        continue
                    if event.details is not None:
                        finished = await _read_to_end(response)
                    yield event
            finally:
                if not finished:
                    response.close()  # not read to its end: the backend must see the client leave

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _pool(self) -> aiohttp.ClientSession:
        # Made on first use: a session belongs to the running event loop.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session


async def _read_to_end(response: aiohttp.ClientResponse) -> bool:
    """After the last event: whether the response ended, so its connection can go back to the pool.

    Bounded: a backend that keeps the response open after its last event costs its connection, not
    the answer."""
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(response.content.read(), _END_OF_RESPONSE_SECONDS)
    return response.content.at_eof()


def _event(status: int, payload: bytes) -> TgiStreamEvent | None:
    payload = payload.strip()
    if payload == b"[DONE]":  # an OpenAI-style terminator some servers add
        return None
    try:
        return _decode_event(payload)
    except msgspec.DecodeError:
        pass
    try:  # TGI reports a failure inside a started stream as an error payload
        error = json.loads(payload)
    except ValueError:
        error = None
    if isinstance(error, dict) and isinstance(error.get("error"), str):
        raise parse_error(status, error)
    raise MalformedEvent(f"the backend sent an unexpected event: {payload[:200]!r}")
