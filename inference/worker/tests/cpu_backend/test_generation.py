"""Generation through the real text_generation client (0.7), against the real backend and model.

Greedy text differs between llama.cpp builds, so these tests check properties (counts, finish reasons,
equality of runs within one session), never fixed text.
"""

from __future__ import annotations

import json

import httpx
import pytest
from text_generation import AsyncClient, Client
from text_generation.types import FinishReason, Grammar, GrammarType, StreamResponse

from .conftest import CHAT_PROMPT, COUNTING_PROMPT, STORY_PROMPT, RunningBackend

pytestmark = pytest.mark.slow

TIMEOUT = 120


def client(backend: RunningBackend) -> Client:
    return Client(backend.url, timeout=TIMEOUT)


def async_client(backend: RunningBackend) -> AsyncClient:
    return AsyncClient(backend.url, timeout=TIMEOUT)


def test_generate_returns_text_and_consistent_details(backend: RunningBackend) -> None:
    response = client(backend).generate(CHAT_PROMPT, max_new_tokens=40)
    details = response.details
    assert response.generated_text.strip()
    assert details.generated_tokens == len(details.tokens)
    assert 1 <= details.generated_tokens <= 40
    assert details.seed is None  # greedy
    text_tokens = [t for t in details.tokens if not t.special]
    assert "".join(t.text for t in text_tokens) == response.generated_text
    assert all(t.logprob is not None and t.logprob <= 0 for t in details.tokens)


def test_length_finish_reason_counts_exactly(backend: RunningBackend) -> None:
    response = client(backend).generate(COUNTING_PROMPT, max_new_tokens=7)
    assert response.details.finish_reason == FinishReason.Length
    assert response.details.generated_tokens == 7
    assert len(response.details.tokens) == 7


def test_a_short_answer_ends_with_the_eos_token(backend: RunningBackend) -> None:
    response = client(backend).generate(CHAT_PROMPT, max_new_tokens=200)
    details = response.details
    assert details.finish_reason == FinishReason.EndOfSequenceToken
    assert details.generated_tokens < 200
    last = details.tokens[-1]
    assert last.special
    assert last.text == "<|im_end|>"
    assert "<|im_end|>" not in response.generated_text


async def test_stream_events_and_final_details(backend: RunningBackend) -> None:
    events: list[StreamResponse] = [
        event async for event in async_client(backend).generate_stream(CHAT_PROMPT, max_new_tokens=200)
    ]
    assert events
    *body, last = events
    assert all(e.details is None and e.generated_text is None for e in body)
    assert last.details is not None and last.generated_text is not None
    assert last.details.finish_reason == FinishReason.EndOfSequenceToken
    # One event per generated token (no stop sequence here), the EOS token last.
    assert last.details.generated_tokens == len(events)
    assert last.token.special
    assert "".join(e.token.text for e in events if not e.token.special) == last.generated_text


async def test_stream_and_generate_agree_when_greedy(backend: RunningBackend) -> None:
    aclient = async_client(backend)
    whole = await aclient.generate(STORY_PROMPT, max_new_tokens=30)
    streamed = [e async for e in aclient.generate_stream(STORY_PROMPT, max_new_tokens=30)]
    assert streamed[-1].generated_text == whole.generated_text
    assert [e.token.id for e in streamed] == [t.id for t in whole.details.tokens]


def test_greedy_runs_are_identical(backend: RunningBackend) -> None:
    sync = client(backend)
    first = sync.generate(STORY_PROMPT, max_new_tokens=48)
    # Another prompt in between changes the KV cache; the result must not depend on it.
    sync.generate(COUNTING_PROMPT, max_new_tokens=5)
    second = sync.generate(STORY_PROMPT, max_new_tokens=48)
    third = sync.generate(STORY_PROMPT, max_new_tokens=48)
    assert first.generated_text == second.generated_text == third.generated_text
    assert [t.id for t in first.details.tokens] == [t.id for t in third.details.tokens]


def test_long_prompts_reuse_the_cache_without_changing_greedy_output(backend: RunningBackend) -> None:
    sync = client(backend)
    long_prompt = STORY_PROMPT.replace("bread.", "bread. " + "The oven was warm. " * 40)
    before = backend.metric("oasst_cpu_backend_prefix_cache_tokens_total")
    first = sync.generate(long_prompt, max_new_tokens=20)
    second = sync.generate(long_prompt, max_new_tokens=20)
    assert first.generated_text == second.generated_text
    assert backend.metric("oasst_cpu_backend_prefix_cache_tokens_total") > before


def test_seed_makes_sampling_reproducible(backend: RunningBackend) -> None:
    sync = client(backend)
    runs = [
        sync.generate(STORY_PROMPT, do_sample=True, temperature=1.0, seed=1234, max_new_tokens=30)
        for _ in range(2)
    ]
    assert runs[0].generated_text == runs[1].generated_text
    assert runs[0].details.seed == 1234
    others = {
        sync.generate(STORY_PROMPT, do_sample=True, temperature=1.5, seed=s, max_new_tokens=30).generated_text
        for s in (1, 2, 3)
    }
    assert len(others | {runs[0].generated_text}) > 1


def test_sampling_without_seed_reports_the_seed_it_used(backend: RunningBackend) -> None:
    sync = client(backend)
    first = sync.generate(STORY_PROMPT, do_sample=True, max_new_tokens=20)
    assert first.details.seed is not None
    again = sync.generate(STORY_PROMPT, do_sample=True, seed=first.details.seed, max_new_tokens=20)
    assert again.generated_text == first.generated_text


def test_sampling_parameters_are_accepted(backend: RunningBackend) -> None:
    response = client(backend).generate(
        STORY_PROMPT,
        do_sample=True,
        temperature=0.7,
        top_k=20,
        top_p=0.9,
        typical_p=0.95,
        repetition_penalty=1.3,
        frequency_penalty=0.5,
        watermark=True,
        seed=7,
        max_new_tokens=12,
    )
    assert response.details.generated_tokens == len(response.details.tokens) <= 12


def _stop_spanning_two_tokens(backend: RunningBackend) -> tuple[str, str]:
    """A greedy generation's text and a stop sequence made of the end of one token and the start of the
    next, so the backend has to hold text back across tokens."""
    response = client(backend).generate(STORY_PROMPT, max_new_tokens=40)
    tokens = [t.text for t in response.details.tokens if not t.special]
    for index in range(3, len(tokens) - 1):
        left, right = tokens[index], tokens[index + 1]
        if len(left.strip()) >= 2 and len(right.strip()) >= 2:
            return response.generated_text, left[-2:] + right[:2]
    raise AssertionError(f"no suitable token pair in {tokens}")


def test_stop_sequence_ends_generation_and_is_not_included(backend: RunningBackend) -> None:
    text, stop = _stop_spanning_two_tokens(backend)
    expected = text[: text.find(stop)]
    response = client(backend).generate(STORY_PROMPT, max_new_tokens=40, stop_sequences=[stop])
    assert response.details.finish_reason == FinishReason.StopSequence
    assert response.generated_text == expected
    assert stop not in response.generated_text


async def test_stop_sequence_is_never_streamed(backend: RunningBackend) -> None:
    text, stop = _stop_spanning_two_tokens(backend)
    expected = text[: text.find(stop)]
    shown = ""
    events = []
    async for event in async_client(backend).generate_stream(
        STORY_PROMPT, max_new_tokens=40, stop_sequences=[stop]
    ):
        events.append(event)
        if not event.token.special:
            shown += event.token.text
            # What a reader has seen so far is final: it never contains (part of) the stop sequence
            # that is later taken back.
            assert expected.startswith(shown)
    assert stop not in shown
    assert shown == expected == events[-1].generated_text
    details = events[-1].details
    assert details is not None and details.finish_reason == FinishReason.StopSequence
    # Every generated token is accounted for, including the ones that formed the stop sequence.
    assert details.generated_tokens == len(events)


def test_return_full_text_prepends_the_prompt(backend: RunningBackend) -> None:
    response = client(backend).generate(COUNTING_PROMPT, max_new_tokens=4, return_full_text=True)
    assert response.generated_text.startswith(COUNTING_PROMPT)
    assert len(response.generated_text) > len(COUNTING_PROMPT)


def test_truncate_keeps_the_end_of_a_too_long_prompt(backend: RunningBackend) -> None:
    long_prompt = "word " * 3000 + COUNTING_PROMPT
    response = client(backend).generate(
        long_prompt, truncate=50, max_new_tokens=3, decoder_input_details=True
    )
    assert response.details.generated_tokens == 3
    assert len(response.details.prefill) == 50


def test_top_n_tokens_and_decoder_input_details(backend: RunningBackend) -> None:
    tokens = httpx.post(f"{backend.url}/tokenize", json={"inputs": CHAT_PROMPT}, timeout=TIMEOUT).json()
    response = client(backend).generate(
        CHAT_PROMPT, max_new_tokens=5, top_n_tokens=3, decoder_input_details=True
    )
    details = response.details
    assert [t.id for t in details.prefill] == [t["id"] for t in tokens]
    assert details.top_tokens is not None and len(details.top_tokens) == details.generated_tokens
    for chosen, top in zip(details.tokens, details.top_tokens, strict=True):
        assert len(top) == 3
        logprobs = [t.logprob for t in top]
        assert logprobs == sorted(logprobs, reverse=True)
        # Greedy: the chosen token is the most likely one.
        assert chosen.id == top[0].id


def test_json_grammar_constrains_the_output(backend: RunningBackend) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    }
    response = client(backend).generate(
        CHAT_PROMPT, max_new_tokens=60, grammar=Grammar(type=GrammarType.Json, value=schema)
    )
    assert response.details.finish_reason == FinishReason.EndOfSequenceToken
    parsed = json.loads(response.generated_text)
    assert set(parsed) == {"city"} and isinstance(parsed["city"], str)


def test_json_strings_in_the_grammar_exclude_control_characters() -> None:
    # llama-cpp-python's converter lets a JSON string hold a raw newline; an answer with one would not parse.
    from llama_cpp import LlamaGrammar

    from oasst_cpu_backend.grammar import schema_to_gbnf

    gbnf = schema_to_gbnf({"type": "object", "properties": {"city": {"type": "string"}}})
    (char_rule,) = [line for line in gbnf.splitlines() if line.startswith("char ::=")]
    assert "\\x00-\\x1F" in char_rule
    LlamaGrammar.from_string(gbnf, verbose=False)  # llama.cpp parses it


def test_raw_endpoints_have_tgi_shapes(backend: RunningBackend) -> None:
    body = {"inputs": COUNTING_PROMPT, "parameters": {"max_new_tokens": 3}}
    listed = httpx.post(backend.url, json=body, timeout=TIMEOUT).json()
    assert isinstance(listed, list) and set(listed[0]) == {"generated_text"}
    single = httpx.post(f"{backend.url}/generate", json={**body, "stream": True}, timeout=TIMEOUT).json()
    assert set(single) == {"generated_text"}
    detailed = httpx.post(
        f"{backend.url}/generate",
        json={"inputs": COUNTING_PROMPT, "parameters": {"max_new_tokens": 3, "details": True}},
        timeout=TIMEOUT,
    ).json()
    assert detailed["details"]["generated_tokens"] == 3

    with httpx.stream("POST", f"{backend.url}/generate_stream", json=body, timeout=TIMEOUT) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    lines = [line for line in raw.split("\n") if line]
    assert "[DONE]" not in raw
    assert all(line.startswith("data:{") for line in lines)
    events = [json.loads(line[len("data:") :]) for line in lines]
    assert [e["index"] for e in events] == [1, 2, 3]
    assert set(events[0]) == {"index", "token", "top_tokens", "generated_text", "details"}
    assert set(events[0]["token"]) == {"id", "text", "logprob", "special"}
    # TGI's fields, plus this backend's cached_tokens (prompt tokens from the prefix cache).
    assert events[-1]["details"] == {
        "finish_reason": "length",
        "generated_tokens": 3,
        "seed": None,
        "cached_tokens": 0,
    }
