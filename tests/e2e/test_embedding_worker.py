"""An embedding worker (``OASST_WORKER_BACKEND_KIND=embedding``, the real all-MiniLM-L6-v2 encoder) connected
to a stack: ``POST /v1/embeddings`` -> server -> EmbedWork -> worker -> Embeddings -> the response.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from oasst_shared.model_configs import MINILM_EMBEDDING
from tests.e2e.chat_api import ChatApi
from tests.support.processes import wait_for_model
from tests.support.stacks import Stack, start_stack

pytestmark = pytest.mark.slow

MODEL = MINILM_EMBEDDING.name


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir = tmp_path_factory.mktemp("embedding-stack")
    # No text-generation backend: the embedding worker runs its encoder itself.
    stack = start_stack(
        log_dir, "http://127.0.0.1:9", f"sqlite+aiosqlite:///{log_dir}/oasst.db", None, workers=0
    )
    try:
        worker = stack.start_worker(OASST_WORKER_BACKEND_KIND="embedding")
        try:
            wait_for_model(stack.url, MODEL, timeout=180)
        except RuntimeError:
            raise RuntimeError(f"the embedding worker did not register:\n{worker.log_tail()}") from None
        yield stack
    finally:
        stack.stop()


@pytest.fixture
def client(stack: Stack) -> Iterator[httpx.Client]:
    api = ChatApi(stack.url, f"user-{uuid.uuid4().hex[:8]}")
    yield api.client
    api.client.close()


def embed(client: httpx.Client, inputs: Any, timeout: float = 120) -> dict[str, Any]:
    response = client.post("/v1/embeddings", json={"model": MODEL, "input": inputs}, timeout=timeout)
    assert response.status_code == 200, response.text
    return response.json()


def vectors(body: dict[str, Any]) -> list[list[float]]:
    return [item["embedding"] for item in sorted(body["data"], key=lambda item: item["index"])]


def test_the_worker_registers_its_embedding_model(stack: Stack):
    configs = {c["name"]: c for c in httpx.get(f"{stack.url}/configs/model_configs", timeout=10).json()}
    assert configs[MODEL]["kind"] == "embedding"


def test_embeddings_come_from_the_worker(client: httpx.Client):
    body = embed(client, ["a", "b"])
    first, second = vectors(body)
    assert len(first) == len(second) == 384 and first != second
    assert math.isclose(math.sqrt(sum(x * x for x in first)), 1.0, rel_tol=1e-4)
    assert body["model"] == MODEL
    # [CLS] a [SEP] and [CLS] b [SEP]: counted by the model's tokenizer at the worker.
    assert body["usage"]["prompt_tokens"] == 6


def test_identical_input_gives_identical_vectors(client: httpx.Client):
    together = vectors(
        embed(client, ["the same sentence", "something else entirely, and longer", "the same sentence"])
    )
    assert together[0] == together[2] != together[1]
    [alone] = vectors(embed(client, ["the same sentence"]))
    assert alone == together[0]
    [single] = vectors(embed(client, "the same sentence"))  # a bare string is one input
    assert single == alone


def test_meaning_is_kept(client: httpx.Client):
    cat, kitten, stocks = vectors(
        embed(
            client, ["A cat sits on the mat.", "A kitten is resting on a rug.", "Stock markets fell sharply."]
        )
    )

    def cosine(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True))

    assert cosine(cat, kitten) > cosine(cat, stocks) + 0.2


def test_the_documented_2048_inputs_come_back_whole_in_input_order(client: httpx.Client):
    # Their vectors are some 15 MB of JSON: the worker sends them in parts (a frame holds ~130),
    # and the server puts them back together.
    inputs = [f"input {i}" + " more" * (i % 3) for i in range(2048)]
    body = embed(client, inputs, timeout=900)  # some minutes on two busy cores
    got = vectors(body)
    assert len(got) == 2048 and {len(v) for v in got} == {384}
    assert [item["index"] for item in body["data"]] == list(range(2048))
    assert body["usage"]["prompt_tokens"] > 2048 * 3
    for i in (0, 1, 777, 2047):  # each vector is its own input's, in its place
        [alone] = vectors(embed(client, [inputs[i]]))
        assert sum(x * y for x, y in zip(alone, got[i], strict=True)) > 0.9999
