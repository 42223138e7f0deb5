"""The OpenAI wire models: conversion to our sampling parameters and conversation, and refusals."""

from __future__ import annotations

import base64
import struct

import pytest
from pydantic import ValidationError

from oasst_inference_server.openai_protocol.embeddings import EmbeddingRequest, encode_embedding_base64
from oasst_inference_server.openai_protocol.generation_requests import (
    ChatCompletionRequest,
    CompletionRequest,
)
from oasst_inference_server.openai_protocol.generation_responses import openai_finish_reason

USER = [{"role": "user", "content": "hi"}]


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": USER, **fields})


def test_temperature_zero_is_greedy() -> None:
    params = chat(temperature=0, top_p=0.5, top_k=40, max_tokens=7).to_sampling_parameters(2048)
    assert params.do_sample is False and params.is_greedy
    assert params.temperature is None and params.top_p is None and params.top_k is None
    assert params.max_new_tokens == 7


def test_sampling_parameters_carry_over() -> None:
    params = chat(
        temperature=0.7, top_p=0.9, seed=42, stop="END", max_completion_tokens=12, max_tokens=99
    ).to_sampling_parameters(2048)
    assert params.do_sample is True and params.temperature == 0.7 and params.top_p == 0.9
    assert params.seed == 42 and params.stop == ["END"]
    assert params.max_new_tokens == 12  # max_completion_tokens wins over the older max_tokens
    # top_p=1 and top_k<=0 mean "off"; no limit means the model's context.
    params = chat(top_p=1.0, top_k=-1).to_sampling_parameters(2048)
    assert params.top_p is None and params.top_k is None and params.max_new_tokens == 2048


def test_completions_default_to_sixteen_tokens_like_openai() -> None:
    request = CompletionRequest.model_validate({"model": "m", "prompt": ["once upon a time"]})
    assert request.prompt_text == "once upon a time"
    assert request.to_sampling_parameters(2048).max_new_tokens == 16


def test_leading_system_messages_become_the_system_prompt() -> None:
    request = chat(
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": "Use French."},
            {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "!"}]},
            {"role": "assistant", "content": "Bonjour"},
            {"role": "system", "content": "Now English."},
            {"role": "user", "content": "Thanks"},
        ]
    )
    system, turns = request.to_thread()
    assert system == "Be brief.\n\nUse French."
    assert [(t.role, t.content) for t in turns] == [
        ("user", "Hello!"),
        ("assistant", "Bonjour"),
        ("system", "Now English."),
        ("user", "Thanks"),
    ]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 9}, "n"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"logit_bias": {"1": 2}}, "logit_bias"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"audio": {"voice": "alloy"}}, "audio"),
        ({"store": True}, "store"),
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"stop": ["a", ""]}, "stop"),
        ({"seed": -1}, "seed"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "function", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
    ],
)
def test_unsupported_options_are_refused_naming_the_parameter(fields: dict, param: str) -> None:
    with pytest.raises(ValidationError) as caught:
        chat(**fields)
    assert caught.value.errors()[0]["loc"][0] == param


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"function": {"name": "g"}},
            },
            "tool_choice",
        ),
    ],
)
def test_inconsistent_options_are_refused_naming_the_parameter(fields: dict, named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        chat(**fields)


def test_harmless_options_and_unknown_fields_are_accepted() -> None:
    request = chat(
        n=1,
        logprobs=False,
        tool_choice="none",
        response_format={"type": "text"},
        presence_penalty=0,
        user="u",
        parallel_tool_calls=True,
        some_future_field=[1, 2],
    )
    assert request.to_sampling_parameters(10).max_new_tokens == 10


def test_embedding_inputs() -> None:
    assert EmbeddingRequest.model_validate({"model": "e", "input": "one"}).inputs == ["one"]
    assert EmbeddingRequest.model_validate({"model": "e", "input": ["a", "b"]}).inputs == ["a", "b"]
    for bad in ([], [""], [1, 2], [[1, 2]]):
        with pytest.raises(ValidationError):
            EmbeddingRequest.model_validate({"model": "e", "input": bad})


def test_base64_embeddings_decode_as_the_sdk_does() -> None:
    vector = [0.25, -1.5, 3.0]
    raw = base64.b64decode(encode_embedding_base64(vector))
    assert list(struct.unpack(f"<{len(vector)}f", raw)) == vector


def test_finish_reasons() -> None:
    assert openai_finish_reason("eos_token") == "stop"
    assert openai_finish_reason("stop_sequence") == "stop"
    assert openai_finish_reason("length") == "length"
