"""Rerank and score requests: their bounds (a clear validation error, never a crash), the pairs a score
request compares, and the cosine similarity they are answered with."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from oasst_inference_server.openai_api.similarity import cosine
from oasst_inference_server.openai_protocol.scoring import MAX_RERANK_DOCUMENTS, RerankRequest, ScoreRequest
from oasst_inference_server.openai_protocol.tokenizing import (
    MAX_DETOKENIZE_TOKENS,
    DetokenizeRequest,
    TokenizeRequest,
)


def test_cosine() -> None:
    assert cosine([1.0, 0.0], [2.0, 0.0]) == pytest.approx(1.0)
    assert cosine([1.0, 0.0], [0.0, 3.0]) == pytest.approx(0.0)
    assert cosine([1.0, 1.0], [-1.0, -1.0]) == pytest.approx(-1.0)
    assert cosine([0.0, 0.0], [1.0, 0.0]) == 0.0
    assert cosine([1.0], [1.0, 0.0]) == 0.0


def test_rerank_documents_as_strings_or_objects() -> None:
    request = RerankRequest(model="m", query="q", documents=["a", {"text": "b"}])
    assert request.texts == ["a", "b"] and request.return_documents and request.top_n is None


@pytest.mark.parametrize(
    "body",
    [
        {"query": "q", "documents": []},
        {"query": "", "documents": ["a"]},
        {"query": "q", "documents": [""]},
        {"query": "q", "documents": ["a"] * (MAX_RERANK_DOCUMENTS + 1)},
        {"query": "q", "documents": ["a" * 300_000]},
        {"query": "q", "documents": ["a"], "top_n": -1},
        {"query": "q", "documents": [{"title": "no text"}]},
    ],
)
def test_rerank_bounds(body: dict) -> None:
    with pytest.raises(ValidationError):
        RerankRequest(model="m", **body)


def test_score_pairs() -> None:
    assert ScoreRequest(model="m", text_1="a", text_2="b").pairs() == [(0, 0)]
    assert ScoreRequest(model="m", text_1="a", text_2=["b", "c"]).pairs() == [(0, 0), (0, 1)]
    assert ScoreRequest(model="m", text_1=["a", "b"], text_2=["c", "d"]).pairs() == [(0, 0), (1, 1)]
    for text_1, text_2 in ((["a", "b"], ["c"]), ([], ["c"]), ("a", []), ("", "b"), ("a", ["b"] * 1001)):
        with pytest.raises(ValidationError):
            ScoreRequest(model="m", text_1=text_1, text_2=text_2)


def test_tokenize_and_detokenize_bounds() -> None:
    TokenizeRequest(model="m", prompt="hello")
    TokenizeRequest(model="m", messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True)
    for body in (
        {},
        {"prompt": "a", "messages": [{"role": "user", "content": "hi"}]},
        {"prompt": "a" * 100_001},
        {"prompt": "a", "add_special_tokens": False},
        {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": False},
        {"messages": []},
    ):
        with pytest.raises(ValidationError):
            TokenizeRequest(model="m", **body)
    DetokenizeRequest(model="m", tokens=[0, 1, 2])
    for tokens in ([], [-1], [2**31], [0] * (MAX_DETOKENIZE_TOKENS + 1)):
        with pytest.raises(ValidationError):
            DetokenizeRequest(model="m", tokens=tokens)
