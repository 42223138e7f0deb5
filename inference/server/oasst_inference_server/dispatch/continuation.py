"""Continuation: a message whose worker was lost after it streamed text goes on from that text.

The text is what the message's readers have received since its last restart: its broker stream's
``token`` events after the last ``retry`` (a ``continuation`` keeps what came before it). It is stored
with the message (``answer_prefix``); the next worker that can continue an answer gets it at the start
of the assistant's turn, with the token budget less what it took, and streams only what follows. The
finished answer is the prefix and that worker's part (:func:`continued_result`).

Where continuation is impossible, the message starts over with a ``retry`` event, as before
(docs/failure-semantics.md):

* an answer constrained by a grammar (``response_format`` ``json_object`` or ``json_schema``, a forced
  tool call): the grammar's state at the cut cannot be resumed;
* a stream that cannot tell what its readers got (trimmed to its length limit, gone, the broker down);
* nothing streamed yet (there is nothing to keep);
* a next worker that cannot continue (its backend takes whole chat messages), or a work frame that would
  be over the limit with the prefix (:func:`.work_frames.work_frame` then drops it).
"""

from __future__ import annotations

import json

from oasst_inference_server import events
from oasst_inference_server.broker import Broker, BrokerError
from oasst_inference_server.db.models import DbMessage, MessageKind
from oasst_inference_server.db.payloads import RequestPayload
from oasst_shared.protocol import GeneratedText
from oasst_shared.sampling import SamplingParameters
from oasst_shared.tool_calls import NamedToolChoice

_READ_BATCH = 512


def can_continue(message: DbMessage) -> bool:
    """Whether the message's answer can be continued by another worker (not constrained by a grammar)."""
    if message.kind == MessageKind.embedding:
        return False
    try:
        sampling = SamplingParameters.model_validate(message.sampling_parameters or {})
        payload = RequestPayload.model_validate(message.request_payload or {})
    except ValueError:
        return False
    if sampling.response_format is not None and sampling.response_format.type != "text":
        return False
    forced = payload.tool_choice == "required" or isinstance(payload.tool_choice, NamedToolChoice)
    return not (payload.tools and forced)


async def answer_so_far(broker: Broker, message_id: str) -> str | None:
    """The answer's text as its readers received it since its last restart; None if the stream cannot
    tell (trimmed, gone, the broker unreachable) or holds no text."""
    stream = events.stream_name(message_id)
    parts: list[str] = []
    after: str | None = None
    try:
        if await broker.first_kept_if_trimmed(stream) is not None:
            return None
        while entries := await broker.read_events(stream, after, timeout=0, count=_READ_BATCH):
            for entry in entries:
                kind, text = _token_or_restart(entry.data)
                if kind == "retry":
                    parts.clear()
                elif text:
                    parts.append(text)
            after = entries[-1].id
    except BrokerError:
        return None
    return "".join(parts) or None


def _token_or_restart(data: str) -> tuple[str, str | None]:
    """(the event's type, a token's text) of a stored event."""
    plain = events.plain_token_text(data)
    if plain is not None:
        return "token", json.loads(plain)
    try:
        event = json.loads(data)
    except ValueError:
        return "unreadable", None
    kind = event.get("event_type") if isinstance(event, dict) else None
    if kind == "token" and isinstance(event.get("text"), str):
        return "token", event["text"]
    return str(kind), None


def continued_result(result: GeneratedText, answer_prefix: str | None) -> GeneratedText:
    """The whole answer of a message from its worker's result: after a continuation (the message still
    holds the prefix its worker was sent), the prefix and that worker's part, text and tokens; otherwise
    the result as it is."""
    if answer_prefix is None:
        return result
    return result.model_copy(
        update={
            "text": answer_prefix + result.text,
            "generated_tokens": (result.prefix_tokens or 0) + result.generated_tokens,
            "prefix_tokens": None,
        }
    )
