"""TGI's ``generate_stream``, sent and read as ``text_generation.AsyncClient.generate_stream`` does (its
request and parameter models, its session per request, its error parsing), except that each event's JSON
is kept beside the client's model of it: the final event's ``details`` of the bundled CPU backend carry
``cached_tokens`` (the prompt tokens its prefix cache served), which the client's model drops.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import ClientSession, ClientTimeout
from pydantic import ValidationError
from text_generation.errors import parse_error
from text_generation.types import Parameters, Request, StreamResponse


async def stream_events(
    url: str,
    prompt: str,
    *,
    headers: dict[str, str] | None,
    timeout: ClientTimeout,
    stop_sequences: list[str] | None = None,
    **parameters: Any,
) -> AsyncIterator[tuple[StreamResponse, dict[str, Any]]]:
    """Each event of the stream: the client's model of it, and its JSON. ``parameters``: the keyword
    arguments of ``AsyncClient.generate_stream`` (``stop_sequences`` as it names them)."""
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
    async with (
        ClientSession(headers=headers, timeout=timeout) as session,
        session.post(url, json=request.model_dump()) as response,
    ):
        if response.status != 200:
            raise parse_error(response.status, await response.json())
        async for line in response.content:
            if not line.startswith(b"data:"):
                continue  # the blank line after each event
            payload = json.loads(line[5:])
            try:
                event = StreamResponse(**payload)
            except ValidationError:
                raise parse_error(response.status, payload) from None  # an error event
            yield event, payload


def cached_tokens(payload: dict[str, Any]) -> int | None:
    """The prompt tokens the backend's cache served, from a final event's JSON (the bundled backend's
    ``details.cached_tokens``; TGI does not tell)."""
    details = payload.get("details")
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
