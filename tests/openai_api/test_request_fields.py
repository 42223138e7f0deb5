"""Every field of the OpenAI chat-completions request, enumerated from the official SDK's types, either
works or is refused with a 400 naming it; the original web frontend's plugin routes; structured output
and logprobs on the chat API; an unmodified LangChain example. On the embedded stack (bundled backend).
"""

from __future__ import annotations

import json
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.types.chat import completion_create_params

from oasst_inference_server.openai_protocol.generation_requests import REFUSED_CHAT_FIELDS
from tests.e2e.chat_api import ChatApi, tokens_text
from tests.openai_api.conftest import ApiUser, new_user
from tests.support.stacks import Stack

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
ROOT = Path(__file__).resolve().parents[2]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}},
    },
}
# A value for every field of the SDK's request (with the fields it needs alongside), and whether this
# server honours it. A field the SDK adds later fails test_every_sdk_field_is_classified until it is
# given here, in the request model and in docs/openai-api.md.
SAMPLES: dict[str, tuple[dict[str, Any], bool]] = {
    "messages": ({}, True),
    "model": ({}, True),
    "audio": ({"audio": {"voice": "alloy", "format": "wav"}}, False),
    "frequency_penalty": ({"frequency_penalty": 0.3}, True),
    "function_call": ({"function_call": "auto"}, False),
    "functions": ({"functions": [{"name": "f", "parameters": {"type": "object"}}]}, False),
    "logit_bias": ({"logit_bias": {"50256": -100}}, False),
    "logprobs": ({"logprobs": True}, True),
    "max_completion_tokens": ({"max_completion_tokens": 3}, True),
    "max_tokens": ({"max_tokens": 3}, True),
    "metadata": ({"metadata": {"purpose": "test"}}, True),
    "modalities": ({"modalities": ["text"]}, True),
    "moderation": ({"moderation": {"type": "auto"}}, False),
    "n": ({"n": 2}, True),
    "parallel_tool_calls": ({"parallel_tool_calls": False, "tools": [WEATHER_TOOL]}, True),
    "prediction": ({"prediction": {"type": "content", "content": "Paris"}}, False),
    # TGI's API (the bundled backend's) has no presence penalty: refused by capability, by name.
    "presence_penalty": ({"presence_penalty": 0.3}, False),
    "prompt_cache_key": ({"prompt_cache_key": "k1"}, True),
    "prompt_cache_options": ({"prompt_cache_options": {"mode": "auto"}}, True),
    "prompt_cache_retention": ({"prompt_cache_retention": "24h"}, True),
    "reasoning_effort": ({"reasoning_effort": "low"}, False),
    "response_format": ({"response_format": {"type": "json_object"}}, True),
    "safety_identifier": ({"safety_identifier": "user-1"}, True),
    "seed": ({"seed": 11}, True),
    "service_tier": ({"service_tier": "auto"}, True),
    "stop": ({"stop": ["\n\n"]}, True),
    "store": ({"store": True}, False),
    "stream": ({"stream": True}, True),
    "stream_options": ({"stream": True, "stream_options": {"include_usage": True}}, True),
    "temperature": ({"temperature": 0.5}, True),
    "tool_choice": ({"tool_choice": "auto", "tools": [WEATHER_TOOL]}, True),
    "tools": ({"tools": [WEATHER_TOOL]}, True),
    "top_logprobs": ({"logprobs": True, "top_logprobs": 2}, True),
    "top_p": ({"top_p": 0.9}, True),
    "user": ({"user": "user-1"}, True),
    "verbosity": ({"verbosity": "low"}, False),
    "web_search_options": ({"web_search_options": {"search_context_size": "low"}}, False),
}


def sdk_chat_fields() -> list[str]:
    fields = set(typing.get_type_hints(completion_create_params.CompletionCreateParamsBase))
    fields |= set(typing.get_type_hints(completion_create_params.CompletionCreateParamsStreaming))
    return sorted(fields)


@pytest.fixture(scope="module")
def user(embedded_stack: Stack) -> Iterator[ApiUser]:
    api_user = new_user(embedded_stack)
    yield api_user
    api_user.http.close()


@pytest.fixture(scope="module")
def client(user: ApiUser) -> openai.OpenAI:
    return user.client()


def test_every_sdk_field_is_classified() -> None:
    assert sdk_chat_fields() == sorted(SAMPLES)
    refused = {name for name, (_, works) in SAMPLES.items() if not works}
    # Refused by the request model itself, or by the bundled backend's capabilities (presence_penalty),
    # or for a value only (logit_bias, store: their empty values are fine).
    assert set(REFUSED_CHAT_FIELDS) <= refused


def test_the_docs_table_lists_every_field() -> None:
    first_cells = re.findall(r"^\| (`[^|]+) \|", (ROOT / "docs/openai-api.md").read_text(), re.M)
    documented = {name for cell in first_cells for name in re.findall(r"`([a-z_]+)`", cell)}
    assert set(sdk_chat_fields()) <= documented


@pytest.mark.parametrize("field", sorted(SAMPLES))
def test_each_field_works_or_is_refused_by_name(client: openai.OpenAI, field: str) -> None:
    extra, works = SAMPLES[field]
    request: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 3,
        **extra,
    }
    if not works:
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(**request)
        assert field in str(refused.value.message)
        return
    if request.get("stream"):
        chunks = list(client.chat.completions.create(**request))
        assert chunks and any(c.choices and c.choices[0].finish_reason for c in chunks)
        if "stream_options" in extra:
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
        return
    completion = client.chat.completions.create(**request)
    assert len(completion.choices) == (2 if field == "n" else 1)
    assert completion.choices[0].finish_reason in ("stop", "length", "tool_calls")


# ---------------------------------------------------------------- the original web frontend


def test_the_original_frontends_plugin_calls(embedded_stack: Stack) -> None:
    """Replays website/src/lib/oasst_inference_client.ts: get_plugins() and get_plugin_config()."""
    headers = {"Content-Type": "application/json", "TrustedClient": "{}"}
    with httpx.Client(base_url=embedded_stack.url, headers=headers, timeout=30) as http:
        plugins = http.get("/configs/builtin_plugins")
        assert plugins.status_code == 200 and plugins.json() == []
        entry = {"url": "https://plugins.example/ai-plugin.json", "enabled": True, "trusted": False}
        config = http.post("/configs/plugin_config", content=json.dumps(entry))
        assert config.status_code == 200
        assert config.json() == {
            "url": entry["url"],
            "enabled": False,
            "plugin_config": None,
            "trusted": False,
        }
        bad = http.post("/configs/plugin_config", content=json.dumps({"enabled": True}))
        assert bad.status_code == 422 and "url" in bad.text


# ---------------------------------------------------------------- the chat API


def test_chat_api_structured_output_and_logprobs(embedded_stack: Stack) -> None:
    api = ChatApi(embedded_stack.url, "chat-structured")
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "maxLength": 20}, "count": {"type": "integer"}},
        "required": ["colour", "count"],
    }
    chat_id = api.create_chat()
    _, events = api.ask(
        chat_id,
        "Pick a colour and a number.",
        MODEL,
        max_new_tokens=80,
        response_format={"type": "json_schema", "json_schema": {"name": "pick", "schema": schema}},
        logprobs=True,
        top_logprobs=2,
    )
    final = events[-1].data
    assert final["event_type"] == "message", final
    assert final["message"]["sampling_parameters"]["response_format"]["type"] == "json_schema"
    text = tokens_text(events)
    jsonschema.validate(json.loads(text), schema)
    entries = [e for ev in events if ev.data["event_type"] == "token" for e in ev.data.get("logprobs", [])]
    assert "".join(e["token"] for e in entries) == text
    assert all(len(e["top_logprobs"]) <= 2 for e in entries)


def test_chat_api_refuses_what_the_workers_cannot_do(embedded_stack: Stack) -> None:
    api = ChatApi(embedded_stack.url, "chat-refused")
    chat_id = api.create_chat()
    prompter = api.prompter(chat_id, "Hello")
    prompter.raise_for_status()
    refused = api.assistant(chat_id, prompter.json()["id"], MODEL, presence_penalty=0.5)
    assert refused.status_code == 400 and "presence_penalty" in refused.text


# ---------------------------------------------------------------- LangChain, unmodified


def test_langchain_structured_output_and_tool_calling(user: ApiUser) -> None:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    class City(BaseModel):
        """A city and the country it is in."""

        name: str = Field(description="the city", max_length=40)
        country: str = Field(description="its country", max_length=40)

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return f"It is sunny in {city}."

    # Greedy: the fields' contents are the model's; sampled, a small model may leave one empty.
    llm = ChatOpenAI(  # type: ignore[call-arg]
        model=MODEL, base_url=f"{user.base_url}/v1", api_key=user.token, max_tokens=120, temperature=0
    )

    city = llm.with_structured_output(City).invoke("Tell me about Paris.")
    assert isinstance(city, City) and city.name and city.country

    answer = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("What is the weather in Rome?")
    (call,) = answer.tool_calls  # type: ignore[attr-defined]
    assert call["name"] == "get_weather" and isinstance(call["args"].get("city"), str)
    result = get_weather.invoke(call)
    final = llm.invoke(["What is the weather in Rome?", answer, result])
    assert isinstance(final.content, str) and final.content.strip()
