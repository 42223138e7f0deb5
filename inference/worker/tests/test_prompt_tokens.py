"""The prompt is counted by the backend only where the count changes the answer: a prompt whose byte
length proves it fits (and leaves the requested answer whole) starts generating at once, and its exact
count, for the usage report, comes while the answer streams. The prompt, the answer's length and the
reported count stay what they were with the count first."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from oasst_shared.chat_template import CHATML_TEMPLATE, render_truncated
from oasst_shared.model_configs import SMOLLM2_135M, ModelConfig
from oasst_shared.protocol import ChatTurn, GeneratedText, Work
from oasst_shared.sampling import SamplingParameters
from oasst_worker.backends.protocols import GenerationBackend
from oasst_worker.backends.records import BackendInfo, GenerationResult, StreamedToken
from oasst_worker.prompt_tokens import PromptCount, token_bound
from tests.support.worker_jobs import run_generation

CONFIG = SMOLLM2_135M.model_copy(update={"chat_template_source": "chatml"})


def words(text: str) -> int:
    """The fake tokenizer: one token a word (well under the byte bound, as real ones are)."""
    return len(text.split())


class Recording(GenerationBackend):
    """Counts words; generates two tokens. Records the order of counts and generations, and what each
    generation was asked. With ``hold_counts``, a count answers only once the first token is out."""

    def __init__(self, *, hold_counts: bool = False) -> None:
        self.log: list[str] = []
        self.prompts: list[tuple[str, int]] = []
        self.first_token_out = asyncio.Event()
        self.hold_counts = hold_counts

    async def info(self) -> BackendInfo:
        return BackendInfo()

    async def healthy(self) -> bool:
        return True

    async def count_tokens(self, text: str) -> int | None:
        self.log.append("count")
        if self.hold_counts:
            await self.first_token_out.wait()
        return words(text)

    async def generate_stream(self, prompt: str, params: Any, max_new_tokens: int) -> AsyncIterator[Any]:
        self.log.append("generate")
        self.prompts.append((prompt, max_new_tokens))
        await asyncio.sleep(0.02)  # the prefill: a count started with the generation would run now
        self.log.append("first token")
        yield StreamedToken(" one")
        self.first_token_out.set()
        yield StreamedToken(" two")
        yield GenerationResult(" one two", "length", 2)


def work(thread: list[ChatTurn], max_new_tokens: int = 100, raw_prompt: str | None = None) -> Work:
    return Work(
        message_id="m1",
        model_config_name=CONFIG.name,
        thread=thread,
        raw_prompt=raw_prompt,
        sampling_parameters=SamplingParameters(max_new_tokens=max_new_tokens),
    )


async def run(backend: Recording, job_work: Work, config: ModelConfig = CONFIG) -> GeneratedText:
    result = (await run_generation(backend, job_work, config)).sent[-1]
    assert isinstance(result, GeneratedText)
    return result


async def test_a_prompt_that_fits_by_its_bytes_generates_before_it_is_counted() -> None:
    # The count answers only after the first token: a job that waited for it would never finish.
    backend = Recording(hold_counts=True)
    result = await run(backend, work([ChatTurn(role="user", content="hello there")]))
    ((prompt, max_new_tokens),) = backend.prompts
    # Counted once the first token is out: it does not share the backend with the prefill.
    assert backend.log == ["generate", "first token", "count"]
    assert max_new_tokens == 100  # as the exact count would have it
    assert result.prompt_tokens == words(prompt)  # the usage report is the exact count


async def test_a_prompt_whose_bound_passes_the_input_limit_is_truncated_by_the_exact_count() -> None:
    config = CONFIG.model_copy(update={"max_input_length": 40})
    thread = [
        ChatTurn(role="user" if i % 2 == 0 else "assistant", content=f"turn {i} " * 3) for i in range(7)
    ]
    backend = Recording()
    result = await run(backend, work(thread, max_new_tokens=10), config)
    ((prompt, _),) = backend.prompts
    expected = await render_truncated(CHATML_TEMPLATE, thread, max_input_tokens=40, count_tokens=words)
    assert token_bound(expected.text) > 40  # only the backend's count can tell that it fits
    assert 0 < expected.dropped_turns and prompt == expected.text
    assert backend.log[0] == "count" and "generate" in backend.log
    assert result.prompt_tokens == expected.prompt_tokens


async def test_an_answer_the_bound_would_cut_short_is_sized_by_the_exact_count() -> None:
    backend = Recording()
    asked = CONFIG.max_total_length  # the whole context: how much is left depends on the exact count
    result = await run(backend, work([ChatTurn(role="user", content="hello there")], max_new_tokens=asked))
    ((prompt, max_new_tokens),) = backend.prompts
    assert backend.log == ["count", "generate", "first token"]
    assert max_new_tokens == CONFIG.max_total_length - words(prompt)
    assert result.prompt_tokens == words(prompt)


async def test_a_raw_prompt_that_fits_is_counted_while_it_generates() -> None:
    backend = Recording(hold_counts=True)
    result = await run(backend, work([ChatTurn(role="user", content="x")], raw_prompt="Once upon a time"))
    assert backend.prompts == [("Once upon a time", 100)]
    assert backend.log == ["generate", "first token", "count"] and result.prompt_tokens == 4


async def test_the_backend_s_own_count_wins_and_stops_ours() -> None:
    asked = asyncio.Event()

    async def never(text: str) -> int:
        asked.set()
        await asyncio.sleep(3600)
        return 0

    count = PromptCount("some prompt", None, never)
    count.reported(7)
    assert await count.result() == 7
    await asyncio.sleep(0)
    assert not asked.is_set()  # ours is never asked once the backend has told


async def test_a_count_that_does_not_come_falls_back_to_the_estimate() -> None:
    async def never(text: str) -> int:
        await asyncio.sleep(3600)
        return 0

    count = PromptCount("a" * 30, None, never)
    assert await count.result(wait=0.01) == 11  # approximate_token_count: 30 // 3 + 1


async def test_a_job_cancelled_before_its_first_token_still_reports_the_count() -> None:
    async def words_of(text: str) -> int:
        return words(text)

    count = PromptCount("three little words", None, words_of)  # asked when the result is built
    assert await count.result(wait=1.0) == 3


def test_the_bound_is_at_least_one_token_a_byte() -> None:
    assert token_bound("") >= 1
    assert token_bound("é" * 10) >= 20  # two bytes each: a byte-level tokenizer may make 20 tokens


async def test_the_count_is_asked_only_once_the_answer_s_stream_has_ended() -> None:
    """A second request to a one-slot backend (a llama.cpp server) while its stream is open ended that
    stream without a finish reason: the exact count waits for the stream to end."""

    class OneSlot(Recording):
        def __init__(self) -> None:
            super().__init__()
            self.streaming = False
            self.counted_while_streaming = False

        async def count_tokens(self, text: str) -> int | None:
            self.counted_while_streaming |= self.streaming
            return await super().count_tokens(text)

        async def generate_stream(self, prompt: str, params: Any, max_new_tokens: int) -> AsyncIterator[Any]:
            self.streaming = True
            try:
                async for item in super().generate_stream(prompt, params, max_new_tokens):
                    yield item
                    await asyncio.sleep(0.01)  # time for a count started meanwhile to reach the backend
            finally:
                self.streaming = False

    backend = OneSlot()
    result = await run(backend, work([ChatTurn(role="user", content="hello there")]))
    assert result.prompt_tokens is not None and "count" in backend.log
    assert not backend.counted_while_streaming
