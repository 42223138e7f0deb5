"""A stored message as the REST API and its events carry it (``MessageRead``)."""

from __future__ import annotations

from oasst_inference_server.db.models import DbMessage, MessageKind
from oasst_inference_server.db.payloads import read_result
from oasst_inference_server.db.stored_json import read_stored
from oasst_shared.sampling import SamplingParameters
from oasst_shared.schemas import MessageRead, MessageState, Role
from oasst_shared.tool_calls import ToolCall


def to_message_read(message: DbMessage) -> MessageRead:
    return MessageRead(
        id=message.id,
        chat_id=message.chat_id,
        parent_id=message.parent_id,
        content=message.content,
        created_at=message.created_at,
        role=Role(message.role),
        state=MessageState(message.state),
        score=message.score,
        model_config_name=message.model_config_name,
        sampling_parameters=read_stored(
            SamplingParameters, message.sampling_parameters, what=f"message {message.id}: sampling_parameters"
        ),
        system_prompt=message.system_prompt,
        error=message.error,
        finish_reason=message.finish_reason,
        generated_tokens=message.generated_tokens,
        prompt_tokens=message.prompt_tokens,
        cached_tokens=message.cached_tokens,
        attempts=message.attempts,
        tool_calls=_tool_calls(message),
    )


def _tool_calls(message: DbMessage) -> list[ToolCall] | None:
    if message.kind == MessageKind.embedding:
        return None
    result = read_result(message.result_payload, what=f"message {message.id}")
    return (result.tool_calls if result else None) or None
