"""Sampling parameters, validated once here for the server, the worker and the clients.

The ranges follow what Hugging Face text-generation-inference accepts, so that a request that passes
validation here is never refused by the backend for its parameters.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from oasst_shared.limits import MAX_NEW_TOKENS, MAX_STOP_SEQUENCE_LENGTH, MAX_TOP_K
from oasst_shared.limits import MAX_STOP_SEQUENCES as MAX_STOP_SEQUENCES  # re-exported


class SamplingParameters(BaseModel):
    """How to sample one answer. ``None`` means "the backend's default"."""

    model_config = ConfigDict(extra="ignore")

    top_k: int | None = Field(default=None, gt=0, le=MAX_TOP_K)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    typical_p: float | None = Field(default=None, gt=0.0, le=1.0)
    temperature: float | None = Field(default=None, ge=0.0, le=100.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=100.0)
    max_new_tokens: int = Field(default=1024, ge=1, le=MAX_NEW_TOKENS)
    seed: int | None = Field(default=None, ge=0, le=2**64 - 1)
    stop: list[str] = Field(default_factory=list, max_length=MAX_STOP_SEQUENCES)
    do_sample: bool | None = None

    @field_validator("stop")
    @classmethod
    def _stop_sequences_not_empty(cls, value: list[str]) -> list[str]:
        if any(not s for s in value):
            raise ValueError("stop sequences must not be empty strings")
        if any(len(s) > MAX_STOP_SEQUENCE_LENGTH for s in value):
            raise ValueError(f"a stop sequence may have at most {MAX_STOP_SEQUENCE_LENGTH} characters")
        return value

    @property
    def is_greedy(self) -> bool:
        """True when the caller asked for deterministic decoding.

        ``temperature == 0`` means greedy in the OpenAI convention; TGI refuses it and wants
        ``do_sample=False`` instead, so backends translate with this property.
        """
        if self.do_sample is False:
            return True
        return self.temperature == 0.0
