"""``/v1/moderations``: the request (a text or a list of texts) and one result per text, in OpenAI's shape."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from oasst_inference_server.openai_protocol.request_base import ApiRequest

MAX_MODERATION_INPUTS = 32
MAX_MODERATION_INPUT_CHARACTERS = 32_000


class ModerationRequest(ApiRequest):
    input: str | list[str]
    model: str | None = Field(default=None, max_length=128)  # accepted and ignored: the hook answers

    @field_validator("input")
    @classmethod
    def _bounded(cls, value: str | list[str]) -> str | list[str]:
        inputs = [value] if isinstance(value, str) else value
        if not inputs:
            raise ValueError("input is empty")
        if len(inputs) > MAX_MODERATION_INPUTS:
            raise ValueError(f"at most {MAX_MODERATION_INPUTS} inputs per request")
        if any(len(text) > MAX_MODERATION_INPUT_CHARACTERS for text in inputs):
            raise ValueError(f"an input is at most {MAX_MODERATION_INPUT_CHARACTERS} characters")
        return value

    @property
    def inputs(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


class ModerationResult(BaseModel):
    flagged: bool
    categories: dict[str, bool]
    category_scores: dict[str, float]


class ModerationResponse(BaseModel):
    id: str
    model: str
    results: list[ModerationResult]
