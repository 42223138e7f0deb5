"""``/v1/completions`` (vLLM's ``OpenAIServingCompletion``): a raw prompt (no chat template), one job per
choice; the answers as completion choices, with the legacy logprobs shape."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.auth.caller import Caller
from oasst_inference_server.db.models import DbMessage
from oasst_inference_server.openai_api.serving_generation import ChoiceAnswer, GenerationServing
from oasst_inference_server.openai_protocol.generation_requests import CompletionRequest
from oasst_inference_server.openai_protocol.generation_responses import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    openai_finish_reason,
)
from oasst_inference_server.openai_protocol.usage import GenerationUsage
from oasst_inference_server.scheduling.worker_registry import LiveModel
from oasst_shared.sampling import SamplingParameters


def _choice(index: int, answer: ChoiceAnswer) -> CompletionChoice:
    final, logprobs = answer
    return CompletionChoice(
        index=index,
        text=final.content or "",
        finish_reason=openai_finish_reason(final.finish_reason),
        logprobs=(CompletionLogprobs.of(logprobs) if logprobs is not None else None),
    )


class CompletionServing(GenerationServing[CompletionRequest, CompletionResponse]):
    chat: ClassVar[bool] = False

    async def _submit(
        self,
        session: AsyncSession,
        caller: Caller,
        model: LiveModel,
        choices: Sequence[SamplingParameters],
        body: CompletionRequest,
    ) -> list[DbMessage]:
        return await self.service.submit_completion(session, caller, model, choices, body.prompt_text)

    def _response(
        self,
        completion_id: str,
        created: int,
        model: str,
        answers: list[ChoiceAnswer],
        usage: GenerationUsage,
    ) -> CompletionResponse:
        return CompletionResponse(
            id=completion_id,
            created=created,
            model=model,
            choices=[_choice(index, answer) for index, answer in enumerate(answers)],
            usage=usage,
        )
