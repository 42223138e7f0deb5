"""/health, /info, /tokenize, /detokenize and /metrics."""

from __future__ import annotations

import httpx
import jinja2
import pytest
from text_generation import Client

from .conftest import CHAT_PROMPT, COUNTING_PROMPT, RunningBackend

pytestmark = pytest.mark.slow

TIMEOUT = 120


def test_health(backend: RunningBackend) -> None:
    response = httpx.get(f"{backend.url}/health", timeout=TIMEOUT)
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


def test_info_describes_the_model_and_its_chat_format(backend: RunningBackend) -> None:
    info = httpx.get(f"{backend.url}/info", timeout=TIMEOUT).json()
    assert info["model_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert info["max_total_tokens"] == 2048
    assert info["max_input_length"] == info["max_input_tokens"] == 2047
    assert info["max_best_of"] == 1
    assert info["max_concurrent_requests"] >= 1
    assert info["version"]
    # The GGUF file's hash: workers report it so that only workers of one model file are compared.
    assert info["model_sha"].startswith("sha256:") and len(info["model_sha"]) == 7 + 64
    assert info["eos_token"] == "<|im_end|>"
    assert info["bos_token"] == "<|im_start|>"
    assert info["add_bos_token"] is False
    # The template from the GGUF renders the prompt format the model was trained on.
    template = jinja2.Environment().from_string(info["chat_template"])
    rendered = template.render(
        messages=[{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
    )
    assert rendered.endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tokenize_gives_ids_texts_and_offsets(backend: RunningBackend) -> None:
    text = "Héllo wörld<|im_end|> 🙂!"
    tokens = httpx.post(f"{backend.url}/tokenize", json={"inputs": text}, timeout=TIMEOUT).json()
    assert tokens and all(set(t) == {"id", "text", "start", "stop"} for t in tokens)
    # Special tokens written in the text are recognised as one token.
    assert any(t["text"] == "<|im_end|>" and t["id"] == 2 for t in tokens)
    for token in tokens:
        assert token["text"] == text[token["start"] : token["stop"]]
    # The offsets cover the text in order, without gaps (an emoji split over byte tokens may overlap).
    assert tokens[0]["start"] == 0 and tokens[-1]["stop"] == len(text)
    for left, right in zip(tokens, tokens[1:], strict=False):
        assert right["start"] <= left["stop"] <= right["stop"]


def test_detokenize_gives_the_text_back(backend: RunningBackend) -> None:
    text = "Héllo wörld<|im_end|> 🙂!"
    tokens = httpx.post(f"{backend.url}/tokenize", json={"inputs": text}, timeout=TIMEOUT).json()
    ids = [t["id"] for t in tokens]
    answer = httpx.post(f"{backend.url}/detokenize", json={"tokens": ids}, timeout=TIMEOUT)
    assert answer.status_code == 200 and answer.json()["prompt"].endswith(text)  # special tokens written out
    for bad in ([-1], [10_000_000], list(range(70_000)), "nope"):
        refused = httpx.post(f"{backend.url}/detokenize", json={"tokens": bad}, timeout=TIMEOUT)
        assert refused.status_code == 422 and refused.json()["error_type"] == "validation", refused.text[:200]


def test_tokenize_counts_match_generation_limits(backend: RunningBackend) -> None:
    tokens = httpx.post(f"{backend.url}/tokenize", json={"inputs": CHAT_PROMPT}, timeout=TIMEOUT).json()
    # A prompt of n tokens leaves exactly 2048 - n new tokens.
    Client(backend.url, timeout=TIMEOUT).generate(
        CHAT_PROMPT, max_new_tokens=2048 - len(tokens), stop_sequences=["."]
    )


def test_metrics_move_after_a_generation(backend: RunningBackend) -> None:
    before = backend.metrics()
    Client(backend.url, timeout=TIMEOUT).generate(COUNTING_PROMPT, max_new_tokens=6)
    after = backend.metrics()

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert delta("oasst_cpu_backend_generated_tokens_total") == 6
    assert delta('oasst_cpu_backend_requests_total{outcome="success"}') == 1
    assert delta("oasst_cpu_backend_time_to_first_token_seconds_count") == 1
    assert delta("oasst_cpu_backend_time_to_first_token_seconds_sum") > 0
    assert delta("oasst_cpu_backend_request_generated_tokens_sum") == 6
    assert delta("oasst_cpu_backend_prompt_tokens_total") > 0
    assert after["oasst_cpu_backend_queue_size"] == 0
    assert after["oasst_cpu_backend_running"] == 0
    response = httpx.get(f"{backend.url}/metrics", timeout=TIMEOUT)
    assert response.headers["content-type"].startswith("text/plain")
    assert "# TYPE oasst_cpu_backend_time_to_first_token_seconds histogram" in response.text
