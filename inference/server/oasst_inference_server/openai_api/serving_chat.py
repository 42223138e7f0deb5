"""``/v1/chat/completions`` (vLLM's ``OpenAIServingChat``): a conversation queued as a chat answer, one
job per choice; the answers as chat completion choices, with their tool calls and logprobs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.auth.caller import Caller
from oasst_inference_server.db.models import DbMessage
from oasst_inference_server.openai_api.serving_generation import ChoiceAnswer, GenerationServing
from oasst_inference_server.openai_protocol.generation_requests import ChatCompletionRequest
from oasst_inference_server.openai_protocol.generation_responses import (
    AssistantMessage,
    ChatCompletionChoice,
    ChatCompletionResponse,
    ChoiceLogprobs,
    openai_finish_reason,
)
from oasst_inference_server.openai_protocol.usage import GenerationUsage
from oasst_inference_server.scheduling.worker_registry import LiveModel
from oasst_shared.sampling import SamplingParameters


def _choice(index: int, answer: ChoiceAnswer) -> ChatCompletionChoice:
    final, logprobs = answer
    calls = final.tool_calls
    return ChatCompletionChoice(
        index=index,
        message=AssistantMessage(content=None if calls else final.content or "", tool_calls=calls),
        finish_reason=openai_finish_reason(final.finish_reason, bool(calls)),
        logprobs=(ChoiceLogprobs(content=logprobs) if logprobs is not None else None),
    )


class ChatCompletionServing(GenerationServing[ChatCompletionRequest, ChatCompletionResponse]):
    chat: ClassVar[bool] = True

    async def _submit(
        self,
        session: AsyncSession,
        caller: Caller,
        model: LiveModel,
        choices: Sequence[SamplingParameters],
        body: ChatCompletionRequest,
    ) -> list[DbMessage]:
        system_prompt, thread = body.to_thread()
        tools = body.tools if body.tools else None
        return await self.service.submit_chat(
            session, caller, model, choices, system_prompt, thread, tools, body.tool_choice
        )

    def _response(
        self,
        completion_id: str,
        created: int,
        model: str,
        answers: list[ChoiceAnswer],
        usage: GenerationUsage,
    ) -> ChatCompletionResponse:
        return ChatCompletionResponse(
            id=completion_id,
            created=created,
            model=model,
            choices=[_choice(index, answer) for index, answer in enumerate(answers)],
            usage=usage,
        )
