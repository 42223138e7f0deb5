"""A message's work frame: built from the stored message (and its chat) as a claim sends it, and bounded
before the message is stored.

:func:`work_frame` builds the frame a claim sends, checked: a message no frame can carry raises
:class:`UnsendableMessage` (the claim then fails it alone). :func:`chat_frame_bound` is what a chat
answer's frame can be at most, from the chat's size alone, so that a submission knows its frame fits
without reading the conversation; only a chat whose bound is over the limit needs its frame built.
"""

from __future__ import annotations

from typing import NamedTuple

from pydantic import ValidationError

from oasst_inference_server.db.models import DbMessage, MessageKind
from oasst_inference_server.db.payloads import RequestPayload
from oasst_inference_server.dispatch.claim import Taken, thread_to
from oasst_shared.chat_template import MAX_CHARS_PER_TOKEN, cut_to_budget
from oasst_shared.protocol import (
    CONTINUATION_PROTOCOL_VERSION,
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    ChatTurn,
    EmbedWork,
    Work,
    dump_frame,
    dump_work,
    frame_bytes,
)
from oasst_shared.sampling import SamplingParameters

# The most bytes a character of a string takes in a frame's JSON: a control character is \u00XX.
MAX_JSON_BYTES_PER_CHAR = 6
# A chat turn's JSON around its content, the longest role and its comma included.
_TURN_BYTES = len(dump_frame(ChatTurn(role="assistant", content=""))) + 1
# A retried message's frame says which attempt it is: room for its digits in a frame built as the first.
ATTEMPT_DIGITS = 8


class UnsendableMessage(Exception):
    """The message cannot become a work frame (text no frame may carry, or over the frame limit): it
    fails alone, with this as its error, and no worker or other message is touched."""


class OverFrameLimit(UnsendableMessage):
    """The message's work would be a frame over the limit (``size`` bytes)."""

    def __init__(self, work: Work | EmbedWork, size: int) -> None:
        super().__init__(
            f"the conversation is {size} bytes, more than the worker frame limit of {MAX_FRAME_BYTES}"
        )
        self.work = work
        self.size = size


class Claimed(NamedTuple):
    """A claimed message's job, and its frame as the claiming worker's protocol version reads it
    (built once: its size is checked, then it is sent as it is)."""

    work: Work | EmbedWork
    frame: str
    # The message held the start of an answer (its lost worker's text) that this job does not continue
    # (the worker cannot, or the frame would be over the limit with it): the answer starts over.
    restarted: bool = False

    @property
    def work_units(self) -> int:
        """What the job's time bound counts (its generation deadline follows from it): the tokens it may
        generate, or for an embedding one per input (2,048 inputs take minutes on a small CPU)."""
        if isinstance(self.work, Work):
            return self.work.sampling_parameters.max_new_tokens
        return len(self.work.inputs)


def work_frame(
    taken: Taken,
    max_input_tokens: int | None,
    protocol_version: int = PROTOCOL_VERSION,
    *,
    room: int = 0,
    cut_chat_prompts: bool = False,
    continues: bool = False,
) -> Claimed:
    """The work frame of a message, serialized for ``protocol_version``; raises :class:`UnsendableMessage`
    if no frame can carry it (:class:`OverFrameLimit` if it, and ``room`` bytes more, are over the limit).

    ``continues``: the claiming worker continues answers (its capabilities say so): a message holding the
    start of its answer is sent with it, unless that puts the frame over the limit; otherwise the job
    starts the answer over (``Claimed.restarted``)."""
    prefix = taken.message.answer_prefix or None
    if not (continues and protocol_version >= CONTINUATION_PROTOCOL_VERSION):
        return _framed(taken, max_input_tokens, protocol_version, room, cut_chat_prompts, None)._replace(
            restarted=prefix is not None
        )
    try:
        return _framed(taken, max_input_tokens, protocol_version, room, cut_chat_prompts, prefix)
    except OverFrameLimit:
        if prefix is None:
            raise
    restarted = _framed(taken, max_input_tokens, protocol_version, room, cut_chat_prompts, None)
    return restarted._replace(restarted=True)


def _framed(
    taken: Taken,
    max_input_tokens: int | None,
    protocol_version: int,
    room: int,
    cut_chat_prompts: bool,
    answer_prefix: str | None,
) -> Claimed:
    try:
        work = build_work(taken, max_input_tokens, cut_chat_prompts, answer_prefix)
    # A stored request of another shape than today's (a list where a list of turns belongs...) is a
    # TypeError or a ValidationError: the message fails, alone.
    except (ValidationError, ValueError, TypeError) as exc:
        raise UnsendableMessage(f"the conversation cannot be sent to a worker: {_first_error(exc)}") from None
    frame = dump_work(work, protocol_version) if isinstance(work, Work) else dump_frame(work)
    size = frame_bytes(frame) + room
    if size > MAX_FRAME_BYTES:
        raise OverFrameLimit(work, size)
    return Claimed(work, frame)


def build_work(
    taken: Taken,
    max_input_tokens: int | None = None,
    cut_chat_prompts: bool = False,
    answer_prefix: str | None = None,
) -> Work | EmbedWork:
    """The job of a message: its conversation cut to ``max_input_tokens`` (the system prompt, then the
    newest turns), or its embedding inputs. A message not claimed yet is built as its first attempt.
    ``cut_chat_prompts``: a chat answer's worker may cut the start of a newest turn the model cannot take
    (the model config's ``chat_prompt_overflow``). ``answer_prefix``: the start of the answer, which the
    job continues."""
    message = taken.message
    payload = RequestPayload.model_validate(message.request_payload or {})
    attempt = max(message.attempts, 1)
    if message.kind == MessageKind.embedding:
        return EmbedWork(
            message_id=message.id,
            model_config_name=message.model_config_name or "",
            inputs=payload.inputs or [],
            attempt=attempt,
        )
    if message.chat_id is not None and message.kind == MessageKind.chat:
        thread = thread_to(message.parent_id, taken.chat)
    else:
        thread = list(payload.thread or [])
    raw_prompt = payload.raw_prompt
    if not thread:
        thread = [ChatTurn(role="user", content=raw_prompt or "")]
    elif max_input_tokens is not None:
        # Only what can reach the prompt travels: the system prompt, then the newest turns.
        thread = cut_to_budget(thread, max_input_tokens=max_input_tokens, system_prompt=message.system_prompt)
    return Work(
        tools=payload.tools or None,
        tool_choice=payload.tool_choice,
        message_id=message.id,
        chat_id=message.chat_id,
        model_config_name=message.model_config_name or "",
        thread=thread,
        system_prompt=message.system_prompt,
        sampling_parameters=SamplingParameters.model_validate(message.sampling_parameters or {}),
        raw_prompt=raw_prompt,
        attempt=attempt,
        # Only the chat API cuts a newest turn the model cannot take; /v1 refused it at submission.
        cut_newest_turn=cut_chat_prompts and message.kind == MessageKind.chat,
        answer_prefix=answer_prefix,
    )


def chat_frame_bound(
    message: DbMessage,
    *,
    chat_messages: int,
    chat_characters: int,
    newest_characters: int | None,
    max_input_tokens: int | None,
) -> int:
    """The most bytes the work frame of a chat answer can take, from the chat's size: every message of
    the chat (``chat_messages``, of ``chat_characters`` together) as a turn, each character at its most
    expensive JSON, but no more characters than the claim's cut keeps (the newest turn, the prompter
    message of ``newest_characters``, and the input budget). Never less than the frame; the skeleton of
    the frame (ids, system prompt, sampling parameters) is built and measured."""
    characters = chat_characters
    if max_input_tokens is not None and newest_characters is not None:
        budget = max_input_tokens * MAX_CHARS_PER_TOKEN - len(message.system_prompt or "")
        characters = min(characters, max(newest_characters, budget))
    skeleton = Work(
        message_id=message.id,
        chat_id=message.chat_id,
        model_config_name=message.model_config_name or "",
        thread=[ChatTurn(role="user", content="")],
        system_prompt=message.system_prompt,
        sampling_parameters=SamplingParameters.model_validate(message.sampling_parameters or {}),
    )
    return (
        frame_bytes(dump_work(skeleton, PROTOCOL_VERSION))
        + ATTEMPT_DIGITS
        + chat_messages * _TURN_BYTES
        + characters * MAX_JSON_BYTES_PER_CHAR
    )


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return str(exc.errors(include_url=False, include_input=False)[0]["msg"])
    return str(exc)
