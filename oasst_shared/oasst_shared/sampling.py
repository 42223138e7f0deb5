"""Sampling parameters, validated once here for the server, the worker and the clients.

The ranges follow what Hugging Face text-generation-inference accepts, so that a request that passes
validation here is never refused by the backend for its parameters.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from oasst_shared.limits import MAX_NEW_TOKENS, MAX_STOP_SEQUENCE_LENGTH, MAX_TOP_K
from oasst_shared.limits import MAX_STOP_SEQUENCES as MAX_STOP_SEQUENCES  # re-exported
from oasst_shared.logprobs import MAX_TOP_LOGPROBS
from oasst_shared.tool_calls import check_schema_size


class JsonSchemaFormat(BaseModel):
    """OpenAI's ``response_format.json_schema``: a named JSON schema the answer must match."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, serialize_by_alias=True)

    name: str = Field(
        default="response",
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="The schema's name (letters, digits, `_`, `-`).",
    )
    description: str | None = Field(default=None, max_length=8192, description="What the answer is for.")
    schema_: dict[str, Any] = Field(
        default_factory=dict, alias="schema", description="The JSON schema the answer must match."
    )
    strict: bool | None = Field(
        None,
        description="Accepted as OpenAI has it; answers always match the schema where it is enforced.",
    )

    @field_validator("schema_")
    @classmethod
    def _bounded(cls, value: dict[str, Any]) -> dict[str, Any]:
        return check_schema_size(value)


class ResponseFormat(BaseModel):
    """Structured output, as OpenAI's ``response_format``: free ``text``, any JSON object
    (``json_object``), or JSON matching a schema (``json_schema``)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "json_object", "json_schema"] = Field(
        "text", description="`text` (free), `json_object` (any JSON object) or `json_schema`."
    )
    json_schema: JsonSchemaFormat | None = Field(
        None, description="With `type` `json_schema`: the named schema."
    )

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type json_schema needs a json_schema")
        return self

    def constraint(self) -> dict[str, Any] | None:
        """The JSON schema every answer must match; None for free text."""
        if self.type == "json_object":
            return {"type": "object"}
        if self.type == "json_schema":
            return (
                self.json_schema.schema_
                if self.json_schema and self.json_schema.schema_
                else {"type": "object"}
            )
        return None


class SamplingParameters(BaseModel):
    """How to sample one answer. ``None`` means "the backend's default"."""

    model_config = ConfigDict(extra="ignore")

    top_k: int | None = Field(
        default=None, gt=0, le=MAX_TOP_K, description="Sample among the k most likely tokens."
    )
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
        default=1024, ge=1, le=MAX_NEW_TOKENS, description="Upper bound on the answer's length."
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
    # Protocol 3: workers without the matching capability (WorkerCapabilities) are never asked for these.
    frequency_penalty: float | None = Field(
        default=None, ge=-2.0, le=2.0, description="OpenAI's frequency penalty; needs the worker capability."
    )
    presence_penalty: float | None = Field(
        default=None, ge=-2.0, le=2.0, description="OpenAI's presence penalty; needs the worker capability."
    )
    response_format: ResponseFormat | None = Field(
        None, description="Structured output: the answer must match this JSON schema."
    )
    logprobs: bool | None = Field(
        None, description="Send each token's log-probability with its text (token frames, events)."
    )
    top_logprobs: int | None = Field(
        default=None, ge=0, le=MAX_TOP_LOGPROBS, description="Alternatives per token sent with `logprobs`."
    )

    @field_validator("stop")
    @classmethod
    def _stop_sequences_not_empty(cls, value: list[str]) -> list[str]:
        if any(not s for s in value):
            raise ValueError("stop sequences must not be empty strings")
        if any(len(s) > MAX_STOP_SEQUENCE_LENGTH for s in value):
            raise ValueError(f"a stop sequence may have at most {MAX_STOP_SEQUENCE_LENGTH} characters")
        return value

    def required_capabilities(self) -> dict[str, str]:
        """The worker capabilities (``WorkerCapabilities`` fields) these parameters need, each with the
        parameter that needs it: a worker without one would silently answer a different question."""
        needed: dict[str, str] = {}
        if self.frequency_penalty:
            needed["frequency_penalty"] = "frequency_penalty"
        if self.presence_penalty:
            needed["presence_penalty"] = "presence_penalty"
        if self.logprobs:
            needed["logprobs"] = "logprobs"
        if self.output_schema is not None:
            needed["structured_output"] = "response_format"
        return needed

    @property
    def output_schema(self) -> dict[str, Any] | None:
        """The JSON schema the answer must match (structured output), or None."""
        return self.response_format.constraint() if self.response_format else None

    @property
    def is_greedy(self) -> bool:
        """True when the caller asked for deterministic decoding.

        ``temperature == 0`` means greedy in the OpenAI convention; TGI refuses it and wants
        ``do_sample=False`` instead, so backends translate with this property.
        """
        if self.do_sample is False:
            return True
        return self.temperature == 0.0
