"""The typed events of a streamed response, numbered: a pure function of the message's events.

The sequence is rebuilt the same way from the message's broker stream by every reader, on any
replica: that is what makes ``starting_after=N`` resume with no gap and no duplicate. Its shape:

``response.created``, ``response.in_progress``; at the first text, ``response.output_item.added``
(the message item) and ``response.content_part.added``; a ``response.output_text.delta`` per token;
at the end ``response.output_text.done``, ``response.content_part.done``, ``response.output_item.done``,
then per function call ``response.output_item.added``, ``response.function_call_arguments.delta``
(fragments), ``response.function_call_arguments.done``, ``response.output_item.done``; finally one of
``response.completed``, ``response.incomplete`` (max_output_tokens reached) or ``response.failed``
(an error, a cancel, or a lost worker after text was sent). Each event has its ``sequence_number``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from oasst_inference_server.responses_api.objects import (
    ResponseStatus,
    call_item,
    message_item_id,
    status_of,
    text_item,
    text_part,
)
from oasst_shared.schemas import MessageRead

ARGUMENT_FRAGMENT = 24  # characters of a call's arguments per delta event
Event = dict[str, Any]
# Renders the response object at a moment of the stream: its status, its output so far, and the
# message as last known (None before the end: the snapshot then shows no usage).
Snapshot = Callable[[ResponseStatus, list[dict[str, Any]], MessageRead | None], dict[str, Any]]
_DELTA = "response.output_text.delta"
_DELTA_TAIL = ',"logprobs":[]}\n\n'


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def render(events: list[Event], starting_after: int | None = None) -> str:
    """The events as server-sent events, without those numbered up to ``starting_after``."""
    return "".join(
        f"event: {e['type']}\ndata: {_json(e)}\n\n"
        for e in events
        if starting_after is None or e["sequence_number"] > starting_after
    )


class ResponseEventSequence:
    def __init__(self, message_id: str, snapshot: Snapshot, *, background: bool = False):
        self._message_id = message_id
        self._item_id = message_item_id(message_id)
        self._snapshot = snapshot
        self._background = background
        self._next = 0
        # The message item's text so far (its deltas as JSON strings), once it is open.
        self._text: list[str] | None = None
        self.ended = False
        # A rendered delta event is this, its number, this, its text (a JSON string), then _DELTA_TAIL:
        # every token's is made from it, with no event built or encoded per token (as rendered by
        # ``render``, which the events other than the deltas go through).
        self._delta_head = f'event: {_DELTA}\ndata: {{"type":"{_DELTA}","sequence_number":'
        self._delta_middle = f',"item_id":{_json(self._item_id)},"output_index":0,"content_index":0,"delta":'

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self._next, **fields}
        self._next += 1
        return event

    def opening(self) -> list[Event]:
        first: ResponseStatus = "queued" if self._background else "in_progress"
        return [
            self._event("response.created", response=self._snapshot(first, [], None)),
            self._event("response.in_progress", response=self._snapshot("in_progress", [], None)),
        ]

    @property
    def sent_text(self) -> bool:
        return bool(self._text)

    def _open_text(self) -> list[Event]:
        if self._text is not None:
            return []
        self._text = []
        where = {"item_id": self._item_id, "output_index": 0, "content_index": 0}
        return [
            self._event(
                "response.output_item.added",
                output_index=0,
                item=text_item(self._message_id, "", "in_progress"),
            ),
            self._event("response.content_part.added", **where, part=text_part("")),
        ]

    def text(self, delta: str) -> list[Event]:
        if not delta:
            return []
        events = self._open_text()
        assert self._text is not None
        self._text.append(_json(delta))
        events.append(
            self._event(
                _DELTA, item_id=self._item_id, output_index=0, content_index=0, delta=delta, logprobs=[]
            )
        )
        return events

    def rendered_text(self, delta_json: str, starting_after: int | None = None) -> str:
        """As ``render(self.text(delta), starting_after)`` for the text given as a JSON string (a stored
        token's, :class:`~..openai_api.openai_service.TokenText`): the stream's hot path, with neither a
        decode nor an event per token."""
        if delta_json == '""':
            return ""
        opening = render(self._open_text(), starting_after) if self._text is None else ""
        assert self._text is not None
        self._text.append(delta_json)
        number = self._next
        self._next += 1
        if starting_after is not None and number <= starting_after:
            return opening
        return f"{opening}{self._delta_head}{number}{self._delta_middle}{delta_json}{_DELTA_TAIL}"

    def finish(self, final: MessageRead) -> list[Event]:
        """The closing events for the finished message (complete, cut at max tokens, or cancelled)."""
        calls = final.tool_calls or []
        status = status_of(final)
        events: list[Event] = []
        if self._text is None and status in ("completed", "incomplete") and (final.content or not calls):
            events += self.text(final.content or "") or self._open_text()  # nothing was streamed
        output: list[dict[str, Any]] = []
        if self._text is not None:
            text = "".join(json.loads(f"[{','.join(self._text)}]"))  # one decode for every delta
            where = {"item_id": self._item_id, "output_index": 0, "content_index": 0}
            item = text_item(self._message_id, text)
            events += [
                self._event("response.output_text.done", **where, text=text, logprobs=[]),
                self._event("response.content_part.done", **where, part=text_part(text)),
                self._event("response.output_item.done", output_index=0, item=item),
            ]
            output.append(item)
        for index, call in enumerate(calls):
            position = len(output)
            args = call.function.arguments
            item_id = call_item(self._message_id, index, call.id, call.function.name, "", "in_progress")
            events.append(self._event("response.output_item.added", output_index=position, item=item_id))
            for start in range(0, len(args), ARGUMENT_FRAGMENT):
                events.append(
                    self._event(
                        "response.function_call_arguments.delta",
                        item_id=item_id["id"],
                        output_index=position,
                        delta=args[start : start + ARGUMENT_FRAGMENT],
                    )
                )
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item_id["id"],
                    output_index=position,
                    name=call.function.name,
                    arguments=args,
                )
            )
            item = call_item(self._message_id, index, call.id, call.function.name, args, "completed")
            events.append(self._event("response.output_item.done", output_index=position, item=item))
            output.append(item)
        kind = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(
            status, "response.failed"
        )
        events.append(self._event(kind, response=self._snapshot(status, output, final)))
        self.ended = True
        return events

    def fail(self, final: MessageRead | None, code: str, message: str) -> list[Event]:
        """The end of a stream that failed: an ``error`` event, then ``response.failed``."""
        snapshot = self._snapshot("failed", [], final)
        snapshot["error"] = {"code": code, "message": message}
        events = [
            self._event("error", code=code, message=message, param=None),
            self._event("response.failed", response=snapshot),
        ]
        self.ended = True
        return events
