"""The token usage every answer reports."""

from __future__ import annotations

from pydantic import BaseModel, Field


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
    def of(
        cls, prompt_tokens: int | None, completion_tokens: int | None, cached_tokens: int | None = None
    ) -> GenerationUsage:
        prompt, completion = prompt_tokens or 0, completion_tokens or 0
        return cls(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens or 0),
        )
