"""Encoding of the per-message server-sent events.

Events are encoded once, when appended to the broker; readers relay the stored JSON unchanged.
The ``event_type`` field comes first so a reader can recognise a terminal event without parsing.

Which events end a stream is ``oasst_shared.schemas.TERMINAL_EVENT_TYPES`` (``message`` or ``error``; the
clients read the same rule); the server asks :func:`is_terminal` of a stored event and
:func:`is_terminal_type` of a decoded one, never the types themselves.
"""

from __future__ import annotations

import msgspec

from oasst_shared.schemas import (
    TERMINAL_EVENT_TYPES,
    ContinuationEvent,
    ErrorEvent,
    GapEvent,
    MessageEvent,
    MessageRead,
    PendingEvent,
    RetryEvent,
)

_encode = msgspec.json.Encoder().encode
_TOKEN_PREFIX = '{"event_type":"token","text":'
_TERMINAL_PREFIXES = tuple(f'{{"event_type":"{kind}"' for kind in sorted(TERMINAL_EVENT_TYPES))


def token_event(text: str, logprobs: list[dict[str, object]] | None = None) -> str:
    # The hot path: msgspec encodes the text alone, no dict, no pydantic (the same JSON as json.dumps
    # with ensure_ascii=False and compact separators).
    if logprobs:
        return _encode({"event_type": "token", "text": text, "logprobs": logprobs}).decode()
    return f"{_TOKEN_PREFIX}{_encode(text).decode()}}}"


def plain_token_text(data: str) -> str | None:
    """The text of a stored token event that carries nothing but its text, as the JSON string it was
    stored as (``'" Par"'``); None for any other event, a token with logprobs included.

    Lets a reader put the text into its own JSON without decoding and encoding it again. A token
    event is stored as :func:`token_event` writes it, the text first; ``,"logprobs":`` cannot occur
    inside the encoded text, whose every quote is escaped.
    """
    if data.startswith(_TOKEN_PREFIX) and ',"logprobs":' not in data:
        return data[len(_TOKEN_PREFIX) : -1]
    return None


def pending_event(
    queue_position: int,
    queue_size: int,
    estimated_wait_seconds: float | None = None,
    *,
    loading_model: bool = False,
) -> str:
    return PendingEvent(
        queue_position=queue_position,
        queue_size=queue_size,
        estimated_wait_seconds=estimated_wait_seconds,
        loading_model=loading_model or None,
    ).model_dump_json(exclude_none=True)


def retry_event(attempt: int, reason: str) -> str:
    return RetryEvent(attempt=attempt, reason=reason).model_dump_json()


def continuation_event(attempt: int, reason: str) -> str:
    return ContinuationEvent(attempt=attempt, reason=reason).model_dump_json()


def gap_event(after: str, first_kept: str) -> str:
    detail = (
        f"events after {after} were trimmed from the stream (it now starts at {first_kept}): discard "
        "the partial text; the final message event carries the whole answer"
    )
    return GapEvent(detail=detail).model_dump_json()


def message_event(message: MessageRead) -> str:
    return MessageEvent(message=message).model_dump_json()


def error_event(error: str, message: MessageRead | None) -> str:
    return ErrorEvent(error=error, message=message).model_dump_json()


def is_terminal(data: str) -> bool:
    """Whether a stored (encoded) event ends its stream."""
    return data.startswith(_TERMINAL_PREFIXES)


def is_terminal_type(event_type: str) -> bool:
    """Whether an event of this type ends its stream."""
    return event_type in TERMINAL_EVENT_TYPES
