"""Continuous batching and the prefix cache, on the real backend and model.

Greedy text differs between llama.cpp builds, so these tests compare runs within one session: a request
decoded beside others must give what it gives alone. Timeouts only bound a hang; nothing here is about
speed (that is bench/cpu_batching.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import httpx
import pytest
from text_generation import AsyncClient
from text_generation.errors import IncompleteGenerationError, ValidationError
from text_generation.types import Grammar, GrammarType

from oasst_cpu_backend.batch import BatchRunner
from oasst_cpu_backend.engine import ModelEngine
from oasst_cpu_backend.records import EngineRequest, EngineResult, Sampling
from oasst_cpu_backend.settings import default_model_path

from .conftest import CHAT_PROMPT, COUNTING_PROMPT, STORY_PROMPT, RunningBackend, start_backend, stop_backend

pytestmark = pytest.mark.slow

TIMEOUT = 120
LONG = 1900
RIVER_PROMPT = "<|im_start|>user\nDescribe a river in spring.<|im_end|>\n<|im_start|>assistant\n"
# Longer than a prefill chunk (64 tokens), so that a follow-up can reuse a chunk of it.
HISTORY = (
    "<|im_start|>system\nYou are a helpful assistant who answers briefly.<|im_end|>\n"
    "<|im_start|>user\nI am planning a trip to Paris in the spring with my family, two children and "
    "a grandmother who walks slowly. We like museums, gardens, bakeries and quiet streets. What should "
    "we see first?<|im_end|>\n<|im_start|>assistant\n"
)


def follow_up(previous_answer: str) -> str:
    return (
        HISTORY + previous_answer + "<|im_end|>\n<|im_start|>user\nAnd on the second day?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


async def stream_timed(
    url: str, prompt: str, max_new_tokens: int, **kwargs: object
) -> tuple[str, float, float]:
    """The streamed text, and when its first and last tokens arrived."""
    text, first, last = "", 0.0, 0.0
    async for event in AsyncClient(url, timeout=TIMEOUT).generate_stream(
        prompt, max_new_tokens=max_new_tokens, **kwargs
    ):
        last = time.monotonic()
        first = first or last
        if not event.token.special:
            text += event.token.text
    return text, first, last


async def test_four_concurrent_greedy_requests_give_what_each_gives_alone(backend: RunningBackend) -> None:
    prompts = [COUNTING_PROMPT, CHAT_PROMPT, STORY_PROMPT, RIVER_PROMPT]
    alone = [(await stream_timed(backend.url, prompt, 32))[0] for prompt in prompts]
    together = await asyncio.gather(*(stream_timed(backend.url, prompt, 32) for prompt in prompts))
    assert [text for text, _, _ in together] == alone
    # They were decoded together: every stream had its first token before any had its last.
    assert max(first for _, first, _ in together) < min(last for _, _, last in together)


def batched_texts(engine: ModelEngine, prompts: list[str], max_new_tokens: int) -> list[str]:
    """Greedy answers to ``prompts``, decoded together in one runner."""
    runner = BatchRunner(engine)
    results: dict[int, EngineResult | BaseException] = {}
    for index, prompt in enumerate(prompts):
        runner.start(
            EngineRequest(engine.tokenize(prompt), max_new_tokens, Sampling()),
            is_cancelled=lambda: False,
            on_step=None,
            on_done=lambda outcome, index=index: results.__setitem__(index, outcome),
        )
    while len(results) < len(prompts):
        runner.step()
    texts = []
    for index in range(len(prompts)):
        result = results[index]
        assert isinstance(result, EngineResult) and result.summary is not None
        texts.append(result.summary.generated_text)
    return texts


def test_batches_decoded_with_more_threads_give_the_same_greedy_texts() -> None:
    # n_threads_batch only spreads a batch's rows over more threads: each number is computed as before.
    prompts = [COUNTING_PROMPT, CHAT_PROMPT, STORY_PROMPT, RIVER_PROMPT]
    texts = []
    for threads_batch in (1, 2):
        engine = ModelEngine(
            default_model_path(), n_ctx=256, n_threads=1, n_threads_batch=threads_batch, parallel_sequences=4
        )
        try:
            texts.append(batched_texts(engine, prompts, 24))
        finally:
            engine.close()
    assert texts[0] == texts[1]
    assert all(texts[0])


async def test_cancel_and_timeout_of_one_sequence_leave_the_others_intact(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    running = start_backend(
        tmp_path_factory.mktemp("deadline-backend"), OASST_CPU_BACKEND_REQUEST_TIMEOUT="8"
    )
    try:
        url = running.url
        alone = [(await stream_timed(url, prompt, 16))[0] for prompt in (CHAT_PROMPT, RIVER_PROMPT)]

        async def timed_out() -> int:
            received = 0
            with pytest.raises(IncompleteGenerationError, match="request_timeout"):
                async for _ in AsyncClient(url, timeout=TIMEOUT).generate_stream(
                    COUNTING_PROMPT, max_new_tokens=LONG
                ):
                    received += 1
            return received

        async def cancelled() -> int:
            stream = AsyncClient(url, timeout=TIMEOUT).generate_stream(STORY_PROMPT, max_new_tokens=LONG)
            seen = 0
            async for _ in stream:
                seen += 1
                if seen == 3:
                    break
            await stream.aclose()
            return seen

        long_one = asyncio.create_task(timed_out())
        await asyncio.to_thread(running.wait_until, lambda: running.metric("oasst_cpu_backend_running") == 1)
        results = await asyncio.gather(
            cancelled(), stream_timed(url, CHAT_PROMPT, 16), stream_timed(url, RIVER_PROMPT, 16)
        )
        assert [text for text, _, _ in results[1:]] == alone
        assert 0 < await long_one < LONG
        running.wait_until(lambda: running.metric("oasst_cpu_backend_cancellations_total") == 1)
        metrics = running.metrics()
        assert metrics['oasst_cpu_backend_requests_total{outcome="timeout"}'] == 1
        assert metrics["oasst_cpu_backend_running"] == 0
        assert httpx.get(f"{url}/health", timeout=10).json()["slots"]["busy"] == 0
        # Every slot serves again.
        again = await asyncio.gather(*(stream_timed(url, CHAT_PROMPT, 16) for _ in range(4)))
        assert [text for text, _, _ in again] == [alone[0]] * 4
    finally:
        stop_backend(running)


async def test_a_grammar_constrained_request_beside_plain_ones(backend: RunningBackend) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    }
    grammar = Grammar(type=GrammarType.Json, value=schema)
    alone = [(await stream_timed(backend.url, p, 24))[0] for p in (COUNTING_PROMPT, STORY_PROMPT)]
    constrained, *plain = await asyncio.gather(
        stream_timed(backend.url, CHAT_PROMPT, 60, grammar=grammar),
        stream_timed(backend.url, COUNTING_PROMPT, 24),
        stream_timed(backend.url, STORY_PROMPT, 24),
    )
    parsed = json.loads(constrained[0])
    assert set(parsed) == {"city"} and isinstance(parsed["city"], str)
    assert [text for text, _, _ in plain] == alone


@pytest.fixture(scope="module")
def small_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBackend]:
    """Two slots of 512 tokens, no prefix cache: cold runs, and a KV budget that is easy to exceed."""
    running = start_backend(
        tmp_path_factory.mktemp("small-backend"),
        OASST_CPU_BACKEND_PARALLEL_SEQUENCES="2",
        OASST_CPU_BACKEND_KV_BUDGET_TOKENS="1024",
        OASST_CPU_BACKEND_PREFIX_CACHE="false",
    )
    try:
        yield running
    finally:
        stop_backend(running)


def generate_details(url: str, prompt: str, max_new_tokens: int) -> tuple[str, dict[str, object]]:
    """Through raw HTTP: the text_generation client drops the `cached_tokens` extension."""
    body = {"inputs": prompt, "parameters": {"max_new_tokens": max_new_tokens, "details": True}}
    answer = httpx.post(f"{url}/generate", json=body, timeout=TIMEOUT).json()
    return answer["generated_text"], answer["details"]


def test_a_follow_up_reuses_the_cached_prefix_and_answers_as_a_cold_run(
    backend: RunningBackend, small_backend: RunningBackend
) -> None:
    answer, _ = generate_details(backend.url, HISTORY, 24)
    prompt = follow_up(answer)
    before = backend.metric("oasst_cpu_backend_prefix_cache_tokens_total")
    reused, details = generate_details(backend.url, prompt, 24)
    cached = details["cached_tokens"]
    assert isinstance(cached, int) and cached > 0
    assert backend.metric("oasst_cpu_backend_prefix_cache_tokens_total") - before == cached
    fresh, cold_details = generate_details(small_backend.url, prompt, 24)
    assert cold_details["cached_tokens"] == 0
    assert reused == fresh
    # A streamed answer reports it in its last event's details.
    raw = httpx.post(
        f"{backend.url}/generate_stream",
        json={"inputs": prompt, "parameters": {"max_new_tokens": 2}},
        timeout=TIMEOUT,
    ).text
    final = json.loads([line for line in raw.splitlines() if line.startswith("data:")][-1][5:])
    assert final["details"]["cached_tokens"] > 0


async def test_the_kv_budget_is_respected(small_backend: RunningBackend) -> None:
    url = small_backend.url
    info = httpx.get(f"{url}/info", timeout=10).json()
    assert info["max_total_tokens"] == 512 and info["max_batch_size"] == 2
    # A request that could never fit its slot is refused with a clear error.
    with pytest.raises(ValidationError, match="must be <= 512"):
        await AsyncClient(url, timeout=TIMEOUT).generate(COUNTING_PROMPT, max_new_tokens=600)
    # More requests than slots wait for one, and all finish.
    alone = (await stream_timed(url, CHAT_PROMPT, 12))[0]
    results = await asyncio.gather(*(stream_timed(url, CHAT_PROMPT, 12) for _ in range(5)))
    assert [text for text, _, _ in results] == [alone] * 5
    health = httpx.get(f"{url}/health", timeout=10).json()
    assert health["slots"] == {"total": 2, "busy": 0}
    assert health["kv_cache_free_tokens"] == 1024


async def test_health_and_metrics_report_slots(backend: RunningBackend) -> None:
    health = httpx.get(f"{backend.url}/health", timeout=10).json()
    assert health["slots"]["total"] == 4
    stream = AsyncClient(backend.url, timeout=TIMEOUT).generate_stream(COUNTING_PROMPT, max_new_tokens=LONG)
    await stream.__anext__()
    busy = httpx.get(f"{backend.url}/health", timeout=10).json()
    assert busy["slots"]["busy"] >= 1
    assert busy["kv_cache_free_tokens"] <= health["kv_budget_tokens"] - busy["kv_budget_tokens"] // 4
    metrics = backend.metrics()
    assert metrics["oasst_cpu_backend_slots_total"] == 4 and metrics["oasst_cpu_backend_slots_busy"] >= 1
    await stream.aclose()
    backend.wait_until(lambda: backend.metric("oasst_cpu_backend_slots_busy") == 0)
    assert backend.metric("oasst_cpu_backend_kv_cache_free_tokens") == health["kv_budget_tokens"]
