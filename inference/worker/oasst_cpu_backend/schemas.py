"""Request and response bodies of the text-generation-inference (TGI) HTTP API.

Field names and shapes follow TGI so that the `text_generation` client parses them unchanged. Requests
only check types here; value ranges are checked in validation.py so that errors read like TGI's.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from oasst_cpu_backend.records import FinishReason

MAX_DETOKENIZE_TOKENS = 65_536  # ids of one /detokenize request

ErrorType = Literal["validation", "generation", "overloaded", "incomplete_generation"]


class Grammar(BaseModel):
    type: Literal["json", "regex"]
    value: str | dict[str, Any]


class GenerateParameters(BaseModel):
    # TGI ignores fields it does not know; newer clients send more than this version reads.
    model_config = ConfigDict(extra="ignore")

    best_of: int | None = None
    decoder_input_details: bool = False
    details: bool = False
    do_sample: bool = False
    frequency_penalty: float | None = None
    grammar: Grammar | None = None
    max_new_tokens: int | None = None
    repetition_penalty: float | None = None
    return_full_text: bool | None = False
    seed: int | None = None
    stop: list[str] = Field(default_factory=list)
    temperature: float | None = None
    top_k: int | None = None
    top_n_tokens: int | None = None
    top_p: float | None = None
    truncate: int | None = None
    typical_p: float | None = None
    watermark: bool = False

    @field_validator("stop", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return [] if value is None else value


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    inputs: str
    parameters: GenerateParameters = Field(default_factory=GenerateParameters)
    stream: bool = False

    @field_validator("parameters", mode="before")
    @classmethod
    def _none_is_default(cls, value: Any) -> Any:
        return {} if value is None else value


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    inputs: str
    parameters: GenerateParameters | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    tokens: list[int] = Field(max_length=MAX_DETOKENIZE_TOKENS)


class DetokenizeResponse(BaseModel):
    prompt: str  # vLLM's name for the text


class Token(BaseModel):
    id: int
    text: str
    logprob: float | None = None
    special: bool


class InputToken(BaseModel):
    id: int
    text: str
    logprob: float | None = None


class Details(BaseModel):
    finish_reason: FinishReason
    generated_tokens: int
    seed: int | None = None
    prefill: list[InputToken] = Field(default_factory=list)
    tokens: list[Token] = Field(default_factory=list)
    top_tokens: list[list[Token]] | None = None
    best_of_sequences: None = None
    # An extension: prompt tokens served from the prefix cache (TGI readers ignore it).
    cached_tokens: int = 0


class GenerateResponse(BaseModel):
    generated_text: str
    details: Details | None = None


class StreamDetails(BaseModel):
    finish_reason: FinishReason
    generated_tokens: int
    seed: int | None = None
    cached_tokens: int = 0


class StreamResponse(BaseModel):
    index: int
    token: Token
    top_tokens: list[Token] | None = None
    generated_text: str | None = None
    details: StreamDetails | None = None


class ErrorResponse(BaseModel):
    error: str
    error_type: ErrorType


class SimpleToken(BaseModel):
    id: int
    text: str
    start: int
    stop: int


class Info(BaseModel):
    model_id: str
    model_sha: str | None = None
    model_dtype: str
    model_device_type: str = "cpu"
    model_pipeline_tag: str = "text-generation"
    max_concurrent_requests: int
    max_best_of: int = 1
    max_stop_sequences: int
    max_input_length: int
    # Newer TGI releases renamed max_input_length; both are served so either kind of reader works.
    max_input_tokens: int
    max_total_tokens: int
    max_top_n_tokens: int
    max_batch_size: int = 1  # the sequences decoded together: parallel_sequences
    validation_workers: int = 1
    version: str
    sha: str | None = None
    docker_label: str | None = None
    # Extensions of this backend: what the worker needs to render prompts for the model it serves.
    backend: str = "oasst-cpu-backend (llama.cpp)"
    llama_cpp_version: str
    # The model config served (None: the settings' model file as it is) and its file's GGUF type.
    model_config_name: str | None = None
    quantization: str | None = None
    # The size of the file it serves: what the model takes in memory, about (workers announce it).
    model_file_bytes: int | None = None
    chat_template: str | None
    bos_token: str | None
    eos_token: str | None
    add_bos_token: bool
