"""Sampling parameters, validated once here for the server, the worker and the clients.

The ranges follow what Hugging Face text-generation-inference accepts, so that a request that passes
validation here is never refused by the backend for its parameters.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_STOP_SEQUENCES = 4  # TGI's default limit


class SamplingParameters(BaseModel):
    """How to sample one answer. ``None`` means "the backend's default"."""

    model_config = ConfigDict(extra="ignore")

    top_k: int | None = Field(default=None, gt=0, description="Sample among the k most likely tokens.")
    top_p: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="Nucleus sampling: the smallest set of tokens with this probability mass.",
    )
    typical_p: float | None = Field(default=None, gt=0.0, le=1.0, description="Typical sampling mass.")
    temperature: float | None = Field(
        default=None, ge=0.0, le=100.0, description="0 means greedy (deterministic) decoding."
    )
    repetition_penalty: float | None = Field(
        default=None, gt=0.0, le=100.0, description="Above 1 discourages repeating tokens."
    )
    max_new_tokens: int = Field(
        default=1024, ge=1, le=65536, description="Upper bound on the answer's length."
    )
    seed: int | None = Field(default=None, ge=0, le=2**64 - 1, description="For repeatable sampling.")
    stop: list[str] = Field(
        default_factory=list,
        max_length=MAX_STOP_SEQUENCES,
        description="The answer ends before any of these.",
    )
    do_sample: bool | None = Field(
        None, description="False forces greedy decoding; null leaves it to the other parameters."
    )

    @field_validator("stop")
    @classmethod
    def _stop_sequences_not_empty(cls, value: list[str]) -> list[str]:
        if any(not s for s in value):
            raise ValueError("stop sequences must not be empty strings")
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
