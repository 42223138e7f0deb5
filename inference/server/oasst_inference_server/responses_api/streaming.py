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
from oasst_inference_server.responses_api.event_sequence import ResponseEventSequence, render
from oasst_shared.schemas import ErrorEvent, MessageEvent, PendingEvent, RetryEvent, TokenEvent


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
                # One write per batch of events: a stream that fell behind catches up in one send.
                out: list[str] = []
                for event in batch:
                    if type(event) is TokenText:
                        out.append(sequence.rendered_text(event.json, starting_after))
                    elif isinstance(event, TokenEvent):
                        text = json.dumps(event.text, ensure_ascii=False)
                        out.append(sequence.rendered_text(text, starting_after))
                    elif isinstance(event, PendingEvent):
                        out.append(pending_comment(event))
                    elif isinstance(event, MessageEvent):
                        finished = True
                        out.append(render(sequence.finish(event.message), starting_after))
                    elif isinstance(event, ErrorEvent):
                        finished = True
                        failure = generation_failure(event)
                        failed = sequence.fail(event.message, failure.code, failure.detail)
                        out.append(render(failed, starting_after))
                    elif isinstance(event, RetryEvent) and sequence.sent_text:
                        # Text already sent cannot be taken back: the stream ends here (the
                        # regeneration is cancelled unless the response runs in the background).
                        failed = sequence.fail(
                            None,
                            "worker_lost",
                            f"the worker generating this answer was lost ({event.reason}); "
                            "the text already sent cannot be taken back: retry the request",
                        )
                        out.append(render(failed, starting_after))
                    if sequence.ended:
                        break
                if chunk := "".join(out):
                    yield chunk
                if sequence.ended:
                    return
    finally:
        if cancel_on_leave:
            await openai.settle(message, finished, scrub=message.kind == MessageKind.completion)
