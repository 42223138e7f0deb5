"""What a serving object hands its route: an answer with the headers it goes out with, or a stream of
server-sent events (already formatted, ``data:`` and ``event:`` lines) with its headers. The route turns
either into its HTTP response (:mod:`oasst_inference_server.api.served`)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Answer(Generic[T]):
    """A whole answer: the body, and headers such as ``X-Request-Id``."""

    body: T
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EventStream:
    """A streamed answer. Everything that can refuse the request was checked before it was made: its
    first event is sent with a 200."""

    events: AsyncGenerator[str, None]
    headers: dict[str, str] = field(default_factory=dict)
