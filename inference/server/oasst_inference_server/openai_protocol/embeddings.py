"""``/v1/embeddings``: the request (text inputs only) and the vectors, as floats or base64."""

from __future__ import annotations

import base64
import struct
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from oasst_inference_server.openai_protocol.request_base import MAX_PROMPT_CHARACTERS, ApiRequest
from oasst_inference_server.openai_protocol.usage import UsageInfo

MAX_EMBEDDING_INPUTS = 2048


def encode_embedding_base64(vector: list[float]) -> str:
    """``encoding_format="base64"``: little-endian float32, as the OpenAI SDK decodes it."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


class EmbeddingRequest(ApiRequest):
    model: str = Field(min_length=1, max_length=128)
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None

    @field_validator("input")
    @classmethod
    def _text_inputs(cls, value: str | list[str] | list[int] | list[list[int]]) -> str | list[str]:
        inputs = [value] if isinstance(value, str) else value
        texts = [i for i in inputs if isinstance(i, str)]
        if not inputs:
            raise ValueError("input is empty")
        if len(texts) != len(inputs):
            raise ValueError("token-id inputs are not supported: send text")
        if len(texts) > MAX_EMBEDDING_INPUTS:
            raise ValueError(f"at most {MAX_EMBEDDING_INPUTS} inputs per request")
        if any(not t for t in texts):
            raise ValueError("inputs must not be empty strings")
        if sum(len(t) for t in texts) > MAX_PROMPT_CHARACTERS:
            raise ValueError(f"the inputs exceed {MAX_PROMPT_CHARACTERS} characters")
        return value if isinstance(value, str) else texts

    @field_validator("dimensions")
    @classmethod
    def _native_dimensions(cls, value: int | None) -> int | None:
        if value is not None:
            raise ValueError("dimensions is not supported: vectors have the model's native dimension")
        return value

    @property
    def inputs(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else [i for i in self.input if isinstance(i, str)]


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # a base64 string with encoding_format="base64"


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: UsageInfo
