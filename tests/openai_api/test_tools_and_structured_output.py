"""Structured outputs, tool calls, logprobs and several choices, driven by the official ``openai`` SDK.

Two real deployments, one each per module run: the embedded stack with the bundled CPU backend (the
worker renders the tools into the prompt and constrains the answer with the backend's JSON-schema
grammar) and a stack whose worker (``openai`` kind, chat mode) relays to llama-cpp-python's own OpenAI
server, which takes ``response_format``, tools and logprobs itself. Both serve SmolLM2; answers are
checked for properties (they parse, they validate, streamed equals unstreamed), not for fixed text.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import jsonschema
import openai
import pytest

from tests.openai_api.conftest import ApiUser, new_user
from tests.support.llama_server import ALIAS, OpenAiWorker, stack_on_llama_server
from tests.support.stacks import Stack

pytestmark = pytest.mark.slow

BUNDLED_MODEL = "SmolLM2-135M-Instruct"

CITY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 40},
        "country": {"type": "string", "minLength": 1, "maxLength": 40},
        "population_millions": {"type": "integer"},
        "is_capital": {"type": "boolean"},
    },
    "required": ["city", "country", "population_millions", "is_capital"],
    "additionalProperties": False,
}
CITIES = [
    "Paris", "Tokyo", "Lagos", "Lima", "Oslo", "Cairo", "Delhi", "Quito", "Rome", "Seoul",
    "Berlin", "Nairobi", "Toronto", "Madrid", "Hanoi", "Sydney", "Bogota", "Dublin", "Manila", "Vienna",
]  # fmt: skip
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 1, "maxLength": 40},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a timezone.",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "maxLength": 40}},
            "required": ["timezone"],
            "additionalProperties": False,
        },
    },
}
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]
FORCE_WEATHER = {"type": "function", "function": {"name": "get_weather"}}


@dataclass
class Deployment:
    kind: str
    stack: Stack
    model: str
    user: ApiUser

    def client(self) -> openai.OpenAI:
        return self.user.client()


@pytest.fixture(scope="module")
def bundled(embedded_stack: Stack) -> Iterator[Deployment]:
    user = new_user(embedded_stack)
    yield Deployment("bundled", embedded_stack, BUNDLED_MODEL, user)
    user.http.close()


@pytest.fixture(scope="module")
def llama_openai(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """A stack whose only worker relays, in chat mode, to llama-cpp-python's OpenAI server."""
    model = f"smollm2-llama-openai-{uuid.uuid4().hex[:6]}"
    worker = OpenAiWorker(
        model,
        env={
            "OASST_WORKER_OPENAI_MODE": "chat",
            "OASST_WORKER_OPENAI_RESPONSE_FORMAT": "llama-cpp-python",
            "OASST_WORKER_BACKEND_MODEL": ALIAS,
        },
    )
    log_dir = tmp_path_factory.mktemp("openai-features-llama")
    # By default llama-cpp-python's server interrupts a running request when another arrives.
    with stack_on_llama_server(log_dir, [worker], INTERRUPT_REQUESTS="false") as (stack, _):
        user = new_user(stack)
        yield Deployment("openai", stack, model, user)
        user.http.close()


@pytest.fixture(params=["bundled", "llama_openai"])
def deployment(request: pytest.FixtureRequest) -> Deployment:
    found: Deployment = request.getfixturevalue(request.param)
    return found


def _city_format() -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True}}


# ---------------------------------------------------------------- structured outputs


def test_json_schema_answers_validate_for_20_prompts(deployment: Deployment) -> None:
    client = deployment.client()

    def ask(city: str) -> tuple[str, str | None]:
        completion = client.chat.completions.create(
            model=deployment.model,
            messages=[{"role": "user", "content": f"Describe the city of {city} as JSON."}],
            response_format=_city_format(),  # type: ignore[arg-type]
            max_tokens=200,
        )
        return completion.choices[0].message.content or "", completion.choices[0].finish_reason

    with ThreadPoolExecutor(max_workers=2) as pool:
        answers = list(pool.map(ask, CITIES))
    assert len({text for text, _ in answers}) > 1, "20 prompts, one answer: the prompt did not matter"
    for text, reason in answers:
        assert reason == "stop", text
        jsonschema.validate(json.loads(text), CITY_SCHEMA)


def test_a_schema_the_grammar_cannot_enforce_is_refused(bundled: Deployment) -> None:
    bounded = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}}
    with pytest.raises(openai.BadRequestError, match="minimum") as refused:
        bundled.client().chat.completions.create(
            model=bundled.model,
            messages=[{"role": "user", "content": "A digit?"}],
            response_format={"type": "json_schema", "json_schema": {"name": "digit", "schema": bounded}},
            max_tokens=20,
        )
    assert refused.value.body["param"] == "response_format"  # type: ignore[index]


def test_json_object_mode_answers_an_object(bundled: Deployment) -> None:
    completion = bundled.client().chat.completions.create(
        model=bundled.model,
        messages=[{"role": "user", "content": "Give me a JSON object about a cat."}],
        response_format={"type": "json_object"},
        max_tokens=120,
    )
    text = completion.choices[0].message.content or ""
    if completion.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # cut by max_tokens: still the start of an object
        assert text.lstrip().startswith("{")


def test_structured_output_on_completions_endpoint(bundled: Deployment) -> None:
    completion = bundled.client().completions.create(
        model=bundled.model,
        prompt="The city of Oslo as JSON: ",
        max_tokens=200,
        extra_body={"response_format": _city_format()},
    )
    jsonschema.validate(json.loads(completion.choices[0].text), CITY_SCHEMA)


# ---------------------------------------------------------------- tool calls


def _arguments(call: Any) -> dict[str, Any]:
    arguments = json.loads(call.function.arguments)
    assert isinstance(arguments, dict)
    return arguments


def test_forced_tool_call_arguments_validate(deployment: Deployment) -> None:
    completion = deployment.client().chat.completions.create(
        model=deployment.model,
        messages=WEATHER_QUESTION,  # type: ignore[arg-type]
        tools=[WEATHER_TOOL, TIME_TOOL],  # type: ignore[list-item]
        tool_choice=FORCE_WEATHER,  # type: ignore[arg-type]
        max_tokens=120,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    jsonschema.validate(_arguments(call), WEATHER_TOOL["function"]["parameters"])


def test_required_tool_call_picks_one_of_the_tools(bundled: Deployment) -> None:
    completion = bundled.client().chat.completions.create(
        model=bundled.model,
        messages=[{"role": "user", "content": "What time is it in Tokyo?"}],
        tools=[WEATHER_TOOL, TIME_TOOL],  # type: ignore[list-item]
        tool_choice="required",
        max_tokens=120,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    tools = {t["function"]["name"]: t for t in (WEATHER_TOOL, TIME_TOOL)}
    assert call.function.name in tools  # type: ignore[union-attr]
    jsonschema.validate(_arguments(call), tools[call.function.name]["function"]["parameters"])  # type: ignore[union-attr]


def test_tool_round_trip_call_result_answer(deployment: Deployment) -> None:
    client = deployment.client()
    first = client.chat.completions.create(
        model=deployment.model,
        messages=WEATHER_QUESTION,  # type: ignore[arg-type]
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice=FORCE_WEATHER,  # type: ignore[arg-type]
        max_tokens=120,
    )
    (call,) = first.choices[0].message.tool_calls or []
    conversation: list[dict[str, Any]] = [
        *WEATHER_QUESTION,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "sunny"})},
    ]
    final = client.chat.completions.create(
        model=deployment.model,
        messages=conversation,  # type: ignore[arg-type]
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice="none",
        max_tokens=40,
    )
    choice = final.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert choice.message.tool_calls is None
    assert (choice.message.content or "").strip()
    # The call and its result reached the prompt: it is longer than the question alone.
    alone = client.chat.completions.create(model=deployment.model, messages=WEATHER_QUESTION, max_tokens=1)  # type: ignore[arg-type]
    assert final.usage is not None and alone.usage is not None
    assert final.usage.prompt_tokens > alone.usage.prompt_tokens + 10


def _stream_tool_calls(
    client: openai.OpenAI, **request: Any
) -> tuple[list[dict[str, Any]], str | None, list[Any]]:
    calls: dict[int, dict[str, Any]] = {}
    deltas: list[Any] = []
    reason = None
    for chunk in client.chat.completions.create(stream=True, **request):
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                deltas.append(delta)
                call = calls.setdefault(delta.index, {"id": None, "name": None, "arguments": ""})
                call["id"] = call["id"] or delta.id
                if delta.function is not None:
                    call["name"] = call["name"] or delta.function.name
                    call["arguments"] += delta.function.arguments or ""
            reason = choice.finish_reason or reason
    return [calls[i] for i in sorted(calls)], reason, deltas


def test_streamed_tool_call_deltas_reassemble_to_the_unstreamed_call(deployment: Deployment) -> None:
    client = deployment.client()
    request: dict[str, Any] = {
        "model": deployment.model,
        "messages": WEATHER_QUESTION,
        "tools": [WEATHER_TOOL],
        "tool_choice": FORCE_WEATHER,
        "max_tokens": 120,
        "temperature": 0,
    }
    whole = client.chat.completions.create(**request).choices[0]
    streamed, reason, deltas = _stream_tool_calls(client, **request)
    assert reason == "tool_calls" == whole.finish_reason
    (call,) = whole.message.tool_calls or []
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed] == [
        (call.function.name, json.loads(call.function.arguments))  # type: ignore[union-attr]
    ]
    # OpenAI's contract: the first delta names the call, the later ones only add argument fragments.
    assert deltas[0].id and deltas[0].type == "function" and deltas[0].function.name == "get_weather"
    assert all(d.id is None and (d.function.name is None) for d in deltas[1:])
    if deployment.kind == "bundled":
        assert len(deltas) > 2  # the arguments came in several fragments


def test_auto_tool_choice_answers_text_or_a_valid_call(bundled: Deployment) -> None:
    completion = bundled.client().chat.completions.create(
        model=bundled.model,
        messages=WEATHER_QUESTION,  # type: ignore[arg-type]
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        max_tokens=80,
    )
    choice = completion.choices[0]
    if choice.finish_reason == "tool_calls":
        (call,) = choice.message.tool_calls or []
        assert call.function.name == "get_weather"  # type: ignore[union-attr]
    else:
        assert choice.message.tool_calls is None and choice.message.content is not None


# ---------------------------------------------------------------- logprobs


def test_logprobs_streamed_equal_unstreamed(deployment: Deployment) -> None:
    client = deployment.client()
    request: dict[str, Any] = {
        "model": deployment.model,
        # A prompt without near ties: greedy decoding on a server with a prompt cache may flip one.
        "messages": [{"role": "user", "content": "Continue: 1, 2, 3, 4, 5, 6,"}],
        "max_tokens": 10,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
    }
    whole = client.chat.completions.create(**request).choices[0]
    assert whole.logprobs is not None and whole.logprobs.content
    entries = whole.logprobs.content
    assert "".join(e.token for e in entries) == whole.message.content
    for entry in entries:
        assert entry.logprob <= 0.0 and entry.bytes == list(entry.token.encode())
        assert 1 <= len(entry.top_logprobs) <= 3
        assert max(t.logprob for t in entry.top_logprobs) >= entry.logprob - 1e-4
    streamed: list[Any] = []
    for chunk in client.chat.completions.create(stream=True, **request):
        for choice in chunk.choices:
            if choice.logprobs is not None and choice.logprobs.content:
                streamed.extend(choice.logprobs.content)
    assert [e.token for e in streamed] == [e.token for e in entries]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in entries], abs=1e-2)


def test_completions_logprobs(bundled: Deployment) -> None:
    completion = bundled.client().completions.create(
        model=bundled.model, prompt="One, two, three,", max_tokens=6, temperature=0, logprobs=2
    )
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.token_logprobs and logprobs.top_logprobs
    assert "".join(logprobs.tokens) == completion.choices[0].text
    assert all(len(top) <= 2 for top in logprobs.top_logprobs)
    assert logprobs.text_offset == sorted(logprobs.text_offset)


def test_too_many_top_logprobs_for_the_backend_is_refused(bundled: Deployment) -> None:
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        bundled.client().chat.completions.create(
            model=bundled.model,
            messages=WEATHER_QUESTION,
            logprobs=True,
            top_logprobs=20,
            max_tokens=2,  # type: ignore[arg-type]
        )


# ---------------------------------------------------------------- several choices, penalties


def test_three_choices_are_three_jobs_counted_in_usage(deployment: Deployment) -> None:
    raw = deployment.client().chat.completions.with_raw_response.create(
        model=deployment.model,
        messages=[{"role": "user", "content": "Write a word."}],
        n=3,
        max_tokens=8,
        temperature=1.0,
        seed=7,
    )
    completion = raw.parse()
    assert [c.index for c in completion.choices] == [0, 1, 2]
    assert all(c.message.content is not None for c in completion.choices)
    request_ids = raw.headers["X-Request-Id"].split(",")
    assert len(request_ids) == 3
    records = [deployment.user.wait_finished(request_id) for request_id in request_ids]
    assert completion.usage is not None
    assert completion.usage.completion_tokens == sum(r["completion_tokens"] for r in records)
    assert completion.usage.prompt_tokens == sum(r["prompt_tokens"] for r in records)
    assert len({r["prompt_tokens"] for r in records}) == 1  # the same prompt, counted three times


def test_several_choices_stream_interleaved_with_their_index(bundled: Deployment) -> None:
    stream = bundled.client().chat.completions.create(
        model=bundled.model,
        messages=[{"role": "user", "content": "Write a word."}],
        n=3,
        max_tokens=8,
        temperature=1.0,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts: dict[int, str] = {}
    reasons: dict[int, str] = {}
    usage = None
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                reasons[choice.index] = choice.finish_reason
        usage = chunk.usage or usage
    assert sorted(texts) == sorted(reasons) == [0, 1, 2]
    assert set(reasons.values()) <= {"stop", "length"}
    assert usage is not None and 3 <= usage.completion_tokens <= 24


def test_penalties_by_backend_capability(deployment: Deployment) -> None:
    client = deployment.client()
    answer = client.chat.completions.create(
        model=deployment.model,
        messages=WEATHER_QUESTION,
        frequency_penalty=0.5,
        max_tokens=4,  # type: ignore[arg-type]
    )
    assert answer.choices[0].message.content is not None
    if deployment.kind == "bundled":  # TGI's API has no presence penalty: refused, by name
        with pytest.raises(openai.BadRequestError, match="presence_penalty"):
            client.chat.completions.create(
                model=deployment.model,
                messages=WEATHER_QUESTION,
                presence_penalty=0.5,
                max_tokens=4,  # type: ignore[arg-type]
            )
    else:
        answer = client.chat.completions.create(
            model=deployment.model,
            messages=WEATHER_QUESTION,
            presence_penalty=0.5,
            max_tokens=4,  # type: ignore[arg-type]
        )
        assert answer.choices[0].message.content is not None
