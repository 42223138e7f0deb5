"""``/tokenize`` and ``/detokenize``: vLLM's request and response shapes.

A prompt (``prompt``) is tokenized as a ``/v1/completions`` prompt is; a conversation (``messages``) as
the prompt a worker renders from it for ``/v1/chat/completions`` (its chat template, the generation
prompt): so ``count`` is the ``usage.prompt_tokens`` the same request gets. Bounded so that the token ids
fit in one worker frame.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from oasst_inference_server.openai_protocol.generation_requests import ChatMessage
from oasst_shared.tool_calls import MAX_TOOLS, ToolDefinition

MAX_TOKENIZE_BYTES = 100_000  # UTF-8 bytes of a prompt, or of a conversation's text
MAX_DETOKENIZE_TOKENS = 32_768
MAX_TOKEN_ID = 2**31 - 1


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class TokenizeRequest(_Request):
    model: str = Field(min_length=1, max_length=128)
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    tools: list[ToolDefinition] | None = Field(default=None, max_length=MAX_TOOLS)
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt and messages")
        if self.prompt is not None:
            if self.add_special_tokens is False:
                raise ValueError(
                    "add_special_tokens: false is not supported (a prompt is tokenized as a job's)"
                )
            if self.add_generation_prompt is not None or self.tools is not None:
                raise ValueError("add_generation_prompt and tools are for messages")
        elif self.add_generation_prompt is False:
            raise ValueError("add_generation_prompt: false is not supported (messages are a job's prompt)")
        size = len((self.prompt or "").encode("utf-8", "surrogatepass")) + sum(
            len(m.text.encode("utf-8", "surrogatepass")) for m in self.messages or []
        )
        if size > MAX_TOKENIZE_BYTES:
            raise ValueError(f"the text has {size} UTF-8 bytes; at most {MAX_TOKENIZE_BYTES} are tokenized")
        return self


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(_Request):
    model: str = Field(min_length=1, max_length=128)
    tokens: list[int] = Field(min_length=1, max_length=MAX_DETOKENIZE_TOKENS)

    @field_validator("tokens")
    @classmethod
    def _token_ids(cls, value: list[int]) -> list[int]:
        if any(not 0 <= token <= MAX_TOKEN_ID for token in value):
            raise ValueError(f"token ids are between 0 and {MAX_TOKEN_ID}")
        return value


class DetokenizeResponse(BaseModel):
    prompt: str
