"""A continued answer on the real backend and model: the start of an answer a lost generation produced,
sent after the prompt with ``X-Answer-Start``, continues a greedy answer exactly as if it had never been
cut, cached or cold, with penalties too; without the header the same tokens are prefilled, which here
gives another answer (the reason for the header)."""

from __future__ import annotations

import httpx
import pytest

from oasst_shared.protocol import ANSWER_START_HEADER

from .conftest import STORY_PROMPT, RunningBackend

pytestmark = pytest.mark.slow

TIMEOUT = 120


def generate(backend: RunningBackend, inputs: str, max_new_tokens: int, start: int | None = None, **params):
    headers = {ANSWER_START_HEADER: str(start)} if start is not None else {}
    body = {"inputs": inputs, "parameters": {"max_new_tokens": max_new_tokens, "details": True, **params}}
    response = httpx.post(f"{backend.url}/generate", json=body, headers=headers, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("params", [{}, {"repetition_penalty": 1.3}], ids=["greedy", "penalty"])
def test_a_continued_greedy_answer_is_the_uninterrupted_one(backend: RunningBackend, params) -> None:
    whole = generate(backend, STORY_PROMPT, 120, **params)
    tokens = [t["text"] for t in whole["details"]["tokens"]]
    assert len(tokens) == 120
    for cut in (1, 30, 70, 119):
        prefix = "".join(tokens[:cut])
        rest = generate(backend, STORY_PROMPT + prefix, 120 - cut, start=len(STORY_PROMPT), **params)
        assert prefix + rest["generated_text"] == whole["generated_text"], cut
        assert rest["details"]["generated_tokens"] == 120 - cut


def test_without_the_header_the_prefilled_start_answers_otherwise(backend: RunningBackend) -> None:
    """What the header is for: a prefill computes the same tokens with other numbers (if this ever gives
    the same answer, the header may no longer be needed)."""
    whole = generate(backend, STORY_PROMPT, 120)
    tokens = [t["text"] for t in whole["details"]["tokens"]]
    differs = 0
    for cut in (28, 56, 84):
        prefix = "".join(tokens[:cut])
        rest = generate(backend, STORY_PROMPT + prefix, 120 - cut)
        differs += prefix + rest["generated_text"] != whole["generated_text"]
    assert differs > 0


@pytest.mark.parametrize("value", ["x", "0", "-3", "99999999", "1" * 40, "\u00b2".encode()])
def test_a_bad_answer_start_is_a_422(backend: RunningBackend, value: str | bytes) -> None:
    body = {"inputs": STORY_PROMPT, "parameters": {"max_new_tokens": 2}}
    response = httpx.post(
        f"{backend.url}/generate", json=body, headers={ANSWER_START_HEADER: value}, timeout=30
    )
    assert response.status_code == 422, response.text
    assert response.json()["error_type"] == "validation"


def test_an_answer_split_otherwise_than_its_text_continues_with_the_tokens_it_was_generated_with(
    backend: RunningBackend,
) -> None:
    """Where the answer's tokens are not the text's own split (found by tokenizing each cut), the backend
    that generated it continues with the tokens it generated, which it still holds."""
    whole = generate(backend, STORY_PROMPT, 160)
    tokens = whole["details"]["tokens"]
    prompt_length = len(tokenize(backend, STORY_PROMPT))
    odd = []
    for cut in range(1, len(tokens)):
        prefix = "".join(t["text"] for t in tokens[:cut])
        own = [t["id"] for t in tokenize(backend, STORY_PROMPT + prefix)][prompt_length:]
        if own != [t["id"] for t in tokens[:cut]]:
            odd.append(cut)
    # The prompt and model are fixed and the answer greedy: a cut to test is there on every run, or the
    # test would pass without testing anything (then pick a prompt whose answer has one).
    assert odd, "every cut of this answer is the tokenizer's own split: none to test here"
    for cut in odd[:3]:
        generate(backend, STORY_PROMPT, 160)  # a slot holds the whole answer again
        prefix = "".join(t["text"] for t in tokens[:cut])
        rest = generate(backend, STORY_PROMPT + prefix, 160 - cut, start=len(STORY_PROMPT))
        assert prefix + rest["generated_text"] == whole["generated_text"], cut


def tokenize(backend: RunningBackend, text: str) -> list[dict]:
    response = httpx.post(f"{backend.url}/tokenize", json={"inputs": text}, timeout=TIMEOUT)
    response.raise_for_status()
    return list(response.json())
