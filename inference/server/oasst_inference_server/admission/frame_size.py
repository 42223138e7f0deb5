"""Does the work a submission starts fit one worker frame (``MAX_FRAME_BYTES``)? Asked before the message
is stored, so that no message is stored that no frame can carry (413 ``request_too_large``).

The frame is the one a claim will send (:mod:`..dispatch.work_frames`), for the newest protocol (the
largest), with room for a retry's attempt number. A request that carries its conversation (the OpenAI
API's) has its frame built and measured: some tens of microseconds. A chat answer's conversation is in
the database; its frame is bounded from the chat's size, which admission has counted already, and only
a chat whose bound is over the limit has its conversation read and its frame built.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.chats.chat_store import ChatSize
from oasst_inference_server.db.models import DbMessage, MessageKind
from oasst_inference_server.dispatch.claim import ChatRow, Taken, conversation
from oasst_inference_server.dispatch.work_frames import (
    ATTEMPT_DIGITS,
    OverFrameLimit,
    UnsendableMessage,
    chat_frame_bound,
    work_frame,
)
from oasst_inference_server.domain_errors import InvalidRequest, TooLarge
from oasst_shared.protocol import (
    MAX_FRAME_BYTES,
    EmbedWork,
    Work,
)


async def check_frame_size(
    session: AsyncSession,
    message: DbMessage,
    *,
    max_input_tokens: int | None,
    chat_size: ChatSize | None = None,
    known: Sequence[DbMessage] = (),
) -> None:
    """``TooLarge`` if ``message``'s work frame would be over the frame limit, ``InvalidRequest`` if no
    frame can carry it at all; ``max_input_tokens`` is the model's input budget (the claim cuts the
    conversation to it), ``chat_size`` the chat's as admission counted it, ``known`` its parent."""
    chat: list[ChatRow] = []
    if message.kind == MessageKind.chat and message.chat_id is not None:
        parent = next((m for m in known if m.id == message.parent_id), None)
        if chat_size is not None:
            bound = chat_frame_bound(
                message,
                chat_messages=chat_size.messages,
                chat_characters=chat_size.characters,
                newest_characters=len(parent.content or "") if parent is not None else None,
                max_input_tokens=max_input_tokens,
            )
            if bound <= MAX_FRAME_BYTES:
                return
        chat = await conversation(session, message, known)
    try:
        work_frame(Taken(message, chat), max_input_tokens, room=ATTEMPT_DIGITS)
    except OverFrameLimit as exc:
        part, part_bytes = _largest_part(exc.work, message.kind)
        raise TooLarge(
            "request_too_large",
            f"the work this request starts would be a frame of {exc.size} bytes, over the worker frame "
            f"limit of {MAX_FRAME_BYTES} bytes; the largest part is {part} ({part_bytes} bytes)",
            param=None if part == "the conversation" else part,
        ) from None
    except UnsendableMessage as exc:
        raise InvalidRequest("unsendable_request", str(exc)) from None


def _largest_part(work: Work | EmbedWork, kind: MessageKind) -> tuple[str, int]:
    """The request field that takes the most of the frame, by its name in the request, and its bytes."""
    if isinstance(work, EmbedWork):
        return "input", _json_bytes(work.inputs)
    chat_api = kind == MessageKind.chat
    sizes: dict[str, int] = {}

    def add(name: str, value: object) -> None:
        sizes[name] = sizes.get(name, 0) + _json_bytes(value)

    conversation = "the conversation" if chat_api else "prompt" if work.raw_prompt else "messages"
    add(conversation, [t.model_dump(mode="json") for t in work.thread])
    add(conversation, work.raw_prompt)
    # On the OpenAI API the system prompt is one of the messages.
    add("system_prompt" if chat_api else conversation, work.system_prompt)
    add("tools", [t.model_dump(mode="json") for t in work.tools or []])
    add(
        "sampling_parameters" if chat_api else "response_format",
        work.sampling_parameters.model_dump(mode="json"),
    )
    name = max(sizes, key=lambda n: sizes[n])
    return name, sizes[name]


def _json_bytes(value: object) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
