"""The token usage every answer reports."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from oasst_shared.schemas import MessageRead


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class PromptTokensDetails(BaseModel):
    # The prompt tokens the worker's backend served from its prefix cache (where it tells; else 0).
    cached_tokens: int = 0


class GenerationUsage(UsageInfo):
    """A chat completion's or completion's usage, with OpenAI's ``prompt_tokens_details``."""

    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)

    @classmethod
    def of_answers(cls, answers: Sequence[MessageRead]) -> GenerationUsage:
        """The usage of a request's answers together (one per choice: each a job of its own, whose prompt
        was processed too)."""
        prompt = sum(a.prompt_tokens or 0 for a in answers)
        completion = sum(a.generated_tokens or 0 for a in answers)
        return cls(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens_details=PromptTokensDetails(
                cached_tokens=sum(a.cached_tokens or 0 for a in answers)
            ),
        )
