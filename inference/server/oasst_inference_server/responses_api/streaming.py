"""Streaming a response: the message's events as the typed, numbered Responses events (``event:`` and
``data:`` lines; no ``[DONE]``).

The events are rebuilt from the start of the message's broker stream on every read
(:mod:`.event_sequence`), and those numbered up to ``starting_after`` are skipped: a client cut off
mid-stream reconnects to any replica and gets the rest, with no gap and no duplicate. A background
response goes on when its reader leaves; any other is cancelled, as a ``/v1`` request is.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from contextlib import aclosing

from oasst_inference_server.db.models import DbMessage, MessageKind
from oasst_inference_server.openai_api.openai_service import (
    IsDisconnected,
    OpenAIService,
    TokenText,
    generation_failure,
)
from oasst_inference_server.openai_api.openai_streams import pending_comment
from oasst_inference_server.responses_api.event_sequence import Event, ResponseEventSequence
from oasst_shared.schemas import ErrorEvent, MessageEvent, PendingEvent, RetryEvent, TokenEvent


def render(events: list[Event], starting_after: int | None = None) -> str:
    return "".join(
        f"event: {e['type']}\ndata: {json.dumps(e, ensure_ascii=False, separators=(',', ':'))}\n\n"
        for e in events
        if starting_after is None or e["sequence_number"] > starting_after
    )


async def stream_response(
    openai: OpenAIService,
    message: DbMessage,
    sequence: ResponseEventSequence,
    *,
    starting_after: int | None,
    cancel_on_leave: bool,
    is_disconnected: IsDisconnected,
) -> AsyncGenerator[str, None]:
    finished = False  # the message ended (not merely the stream)
    try:
        if opening := render(sequence.opening(), starting_after):
            yield opening
        async with aclosing(openai.events(message, is_disconnected)) as batches:
            async for batch in batches:
                events: list[Event] = []
                comments: list[str] = []
                for event in batch:
                    if type(event) is TokenText:
                        events += sequence.text(json.loads(event.json))
                    elif isinstance(event, TokenEvent):
                        events += sequence.text(event.text)
                    elif isinstance(event, PendingEvent):
                        comments.append(pending_comment(event))
                    elif isinstance(event, MessageEvent):
                        finished = True
                        events += sequence.finish(event.message)
                    elif isinstance(event, ErrorEvent):
                        finished = True
                        failure = generation_failure(event)
                        events += sequence.fail(event.message, failure.code, failure.detail)
                    elif isinstance(event, RetryEvent) and sequence.sent_text:
                        # Text already sent cannot be taken back: the stream ends here (the
                        # regeneration is cancelled unless the response runs in the background).
                        events += sequence.fail(
                            None,
                            "worker_lost",
                            f"the worker generating this answer was lost ({event.reason}); "
                            "the text already sent cannot be taken back: retry the request",
                        )
                    if sequence.ended:
                        break
                if out := "".join(comments) + render(events, starting_after):
                    yield out
                if sequence.ended:
                    return
    finally:
        if cancel_on_leave:
            await openai.settle(message, finished, scrub=message.kind == MessageKind.completion)
