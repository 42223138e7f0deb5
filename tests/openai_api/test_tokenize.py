"""``/tokenize`` and ``/detokenize`` answered by the worker's backend (the real CPU backend with SmolLM2):
a round trip gives the text back, and the counts are the ``usage.prompt_tokens`` of the same request."""

from __future__ import annotations

import httpx
import pytest

from tests.openai_api.conftest import ApiUser
from tests.support.stacks import MODEL_NAME, Stack

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
MESSAGES = [
    {"role": "system", "content": "You answer in one word."},
    {"role": "user", "content": "What is the capital of France?"},
]


def _http(stack: Stack, key: str) -> httpx.Client:
    return httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def test_tokenize_round_trip_and_counts_agree_with_usage(stack: Stack, user: ApiUser, key: str) -> None:
    client = user.client(key)
    with _http(stack, key) as http:
        tokenized = http.post("/tokenize", json={"model": MODEL_NAME, "prompt": PROMPT})
        assert tokenized.status_code == 200, tokenized.text
        body = tokenized.json()
        assert body["count"] == len(body["tokens"]) > 0
        assert body["max_model_len"] > body["count"]
        completion = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=2, temperature=0)
        assert completion.usage is not None and completion.usage.prompt_tokens == body["count"]

        detokenized = http.post("/detokenize", json={"model": MODEL_NAME, "tokens": body["tokens"]})
        assert detokenized.status_code == 200, detokenized.text
        assert detokenized.json()["prompt"].endswith(PROMPT)
        again = http.post("/tokenize", json={"model": MODEL_NAME, "prompt": detokenized.json()["prompt"]})
        assert again.json()["tokens"][-body["count"] :] == body["tokens"]

        chat = http.post(
            "/tokenize", json={"model": MODEL_NAME, "messages": MESSAGES, "add_generation_prompt": True}
        )
        assert chat.status_code == 200, chat.text
        answer = client.chat.completions.create(
            model=MODEL_NAME,
            messages=MESSAGES,
            max_tokens=2,
            temperature=0,  # type: ignore[arg-type]
        )
        assert answer.usage is not None and answer.usage.prompt_tokens == chat.json()["count"]
        rendered = http.post("/detokenize", json={"model": MODEL_NAME, "tokens": chat.json()["tokens"]})
        text = rendered.json()["prompt"]
        assert "What is the capital of France?" in text and "You answer in one word." in text


def test_tokenize_bounds_and_errors(stack: Stack, user: ApiUser, key: str) -> None:
    with _http(stack, key) as http:
        cases = [
            ("/tokenize", {"model": MODEL_NAME, "prompt": "a" * 100_001}, 400),
            ("/tokenize", {"model": MODEL_NAME}, 400),
            ("/tokenize", {"model": MODEL_NAME, "prompt": "a", "messages": MESSAGES}, 400),
            ("/tokenize", {"model": "no-such-model", "prompt": "a"}, 404),
            ("/detokenize", {"model": MODEL_NAME, "tokens": [-1]}, 400),
            ("/detokenize", {"model": MODEL_NAME, "tokens": list(range(40_000))}, 400),
            ("/detokenize", {"model": MODEL_NAME, "tokens": [2_000_000_000]}, 400),  # not in the vocabulary
        ]
        for path, body, status in cases:
            response = http.post(path, json=body)
            assert response.status_code == status, (
                path,
                body if len(str(body)) < 200 else "...",
                response.text,
            )
            error = response.json()["error"]  # OpenAI's error shape
            assert error["message"] and error["type"]
        unauthenticated = httpx.post(f"{stack.url}/tokenize", json={"model": MODEL_NAME, "prompt": "a"})
        assert unauthenticated.status_code == 401
