"""``/v1/rerank`` and ``/v1/score`` on the real embedding worker (all-MiniLM-L6-v2): the obviously relevant
document comes first; bounds are clear 400s in OpenAI's error shape."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.openai_api.conftest import new_user
from tests.openai_api.test_embeddings import EMBEDDING_MODEL, embedding_stack  # noqa: F401 (a fixture)
from tests.support.stacks import MODEL_NAME, Stack

pytestmark = pytest.mark.slow

QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Bananas are a good source of potassium.",
    "Paris is the capital and largest city of France.",
    "The stock market fell sharply on Monday.",
]


@pytest.fixture
def http(embedding_stack: Stack) -> Iterator[httpx.Client]:  # noqa: F811 (the fixture imported above)
    user = new_user(embedding_stack)
    key = user.create_key()["key"]
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=embedding_stack.url, headers=headers, timeout=60) as client:
        yield client


def test_rerank_puts_the_relevant_document_first(http: httpx.Client) -> None:
    response = http.post(
        "/v1/rerank", json={"model": EMBEDDING_MODEL, "query": QUERY, "documents": DOCUMENTS}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    results = body["results"]
    assert [r["index"] for r in results][0] == 1 and len(results) == 3
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True) and scores[0] > scores[1] + 0.1
    assert results[0]["document"] == {"text": DOCUMENTS[1]}
    assert body["model"] == EMBEDDING_MODEL and body["usage"]["total_tokens"] > 0

    for path in ("/rerank", "/v2/rerank"):
        other = http.post(
            path,
            json={
                "model": EMBEDDING_MODEL,
                "query": QUERY,
                "documents": [{"text": d} for d in DOCUMENTS],
                "top_n": 1,
                "return_documents": False,
            },
        )
        assert other.status_code == 200, other.text
        (best,) = other.json()["results"]
        assert best["index"] == 1 and best.get("document") is None
        assert best["relevance_score"] == pytest.approx(scores[0], abs=1e-5)


def test_score_one_to_many_and_pairwise(http: httpx.Client) -> None:
    response = http.post("/v1/score", json={"model": EMBEDDING_MODEL, "text_1": QUERY, "text_2": DOCUMENTS})
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    assert [d["index"] for d in data] == [0, 1, 2] and all(d["object"] == "score" for d in data)
    assert max(data, key=lambda d: d["score"])["index"] == 1
    pairwise = http.post(
        "/score",
        json={"model": EMBEDDING_MODEL, "text_1": [QUERY, "A ripe yellow fruit"], "text_2": DOCUMENTS[:2]},
    )
    assert pairwise.status_code == 200, pairwise.text
    pair_scores = [d["score"] for d in pairwise.json()["data"]]
    assert pair_scores[0] == pytest.approx(data[0]["score"], abs=1e-5)
    single = http.post("/v1/score", json={"model": EMBEDDING_MODEL, "text_1": QUERY, "text_2": DOCUMENTS[1]})
    assert single.json()["data"][0]["score"] == pytest.approx(data[1]["score"], abs=1e-5)


def test_rerank_and_score_bounds(http: httpx.Client) -> None:
    cases = [
        ("/v1/rerank", {"query": QUERY, "documents": []}, 400),
        ("/v1/rerank", {"query": QUERY, "documents": ["x"] * 1001}, 400),
        ("/rerank", {"query": QUERY, "documents": ["x" * 300_000]}, 400),
        ("/v1/score", {"text_1": [QUERY, QUERY], "text_2": DOCUMENTS}, 400),
        ("/score", {"text_1": QUERY, "text_2": []}, 400),
    ]
    for path, body, status in cases:
        response = http.post(path, json={"model": EMBEDDING_MODEL, **body})
        assert response.status_code == status, response.text[:300]
        assert response.json()["error"]["type"] == "invalid_request_error"
    generation = http.post("/v1/rerank", json={"model": MODEL_NAME, "query": QUERY, "documents": DOCUMENTS})
    assert generation.status_code == 400 and generation.json()["error"]["code"] == "wrong_model_kind"
    unknown = http.post("/v1/score", json={"model": "no-such-model", "text_1": "a", "text_2": "b"})
    assert unknown.status_code == 404
