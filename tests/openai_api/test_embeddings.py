"""``/v1/embeddings`` through an embedding worker (the real all-MiniLM-L6-v2 encoder, 384 dimensions).

The embedding worker joins the stack for this module only; generation and embedding queues are
separate, so the generation worker never sees this work and vice versa.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.openai_api.conftest import new_user
from tests.support.processes import wait_for_model
from tests.support.stacks import MODEL_NAME, Stack

pytestmark = pytest.mark.slow

EMBEDDING_MODEL = "all-MiniLM-L6-v2"
DIMENSION = 384


@pytest.fixture(scope="module", params=["embedded", "production"])
def embedding_stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    stack: Stack = request.getfixturevalue(f"{request.param}_stack")
    worker = stack.start_worker(
        OASST_WORKER_BACKEND_KIND="embedding", OASST_WORKER_MODEL_CONFIG_NAME=EMBEDDING_MODEL
    )
    try:
        wait_for_model(stack.url, EMBEDDING_MODEL, timeout=180)
    except RuntimeError:
        worker.stop()
        stack.workers.remove(worker)
        raise RuntimeError(f"the embedding worker did not register:\n{worker.log_tail()}") from None
    yield stack
    worker.stop()
    stack.workers.remove(worker)


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def test_embeddings(embedding_stack: Stack) -> None:
    user = new_user(embedding_stack)
    client = user.client(user.create_key()["key"])
    assert EMBEDDING_MODEL in {m.id for m in client.models.list().data}

    texts = ["A cat sits on the mat.", "A kitten is sitting on a rug.", "Stock markets fell sharply today."]
    # The SDK asks for base64 unless told otherwise, and decodes it.
    result = client.embeddings.create(model=EMBEDDING_MODEL, input=texts)
    assert result.model == EMBEDDING_MODEL and [d.index for d in result.data] == [0, 1, 2]
    vectors = [d.embedding for d in result.data]
    assert all(len(v) == DIMENSION for v in vectors)
    assert result.usage.prompt_tokens > 0 and result.usage.total_tokens == result.usage.prompt_tokens
    # Similar sentences are closer than unrelated ones.
    assert _cosine(vectors[0], vectors[1]) > _cosine(vectors[0], vectors[2])

    # Identical input gives identical vectors; float encoding gives the same numbers.
    again = client.embeddings.create(model=EMBEDDING_MODEL, input=texts[0], encoding_format="float")
    assert len(again.data) == 1
    assert again.data[0].embedding == pytest.approx(vectors[0], abs=1e-6)

    record = user.http.get("/usage/requests", params={"limit": 1}).json()["requests"][0]
    assert record["kind"] == "embedding" and record["state"] == "complete"
    assert record["prompt_tokens"] == again.usage.prompt_tokens


def test_embedding_errors(embedding_stack: Stack) -> None:
    client = new_user(embedding_stack).client()
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=EMBEDDING_MODEL, input=[""])
    assert caught.value.body["param"] == "input"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=EMBEDDING_MODEL, input=[[1, 2, 3]])
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=EMBEDDING_MODEL, input="x", dimensions=64)
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="text-embedding-3-small", input="x")
    # An embedding model does not chat.
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=EMBEDDING_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    assert caught.value.body["param"] == "model"  # type: ignore[index]
    # The chat API's model list still has the generation model.
    names = [m["name"] for m in httpx.get(f"{embedding_stack.url}/configs/model_configs").json()]
    assert MODEL_NAME in names
