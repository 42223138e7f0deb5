"""A cancel reaches the job even when the task cancellation itself is lost.

``asyncio.wait_for`` (which the backends use for the stall timeout) returns the inner result instead
of raising when a cancellation lands just as that result arrives, so ``task.cancel()`` alone can be
swallowed and the job would generate to the end. The client also sets ``cancel_requested``; these
tests inject the lost cancellation by setting only the flag.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel

from oasst_shared.model_configs import SMOLLM2_135M
from oasst_shared.protocol import ChatTurn, GeneratedText, Work
from oasst_shared.sampling import SamplingParameters
from oasst_shared.token_frames import TokenFrame
from oasst_worker.backends.protocols import GenerationBackend
from oasst_worker.backends.records import BackendInfo, GenerationResult, StreamedToken
from oasst_worker.jobs.generation import GenerationJob
from oasst_worker.jobs.pool import JobPool
from oasst_worker.prompting import PromptBuilder

CONFIG = SMOLLM2_135M.model_copy(update={"chat_template_source": "chatml"})


class Counting(GenerationBackend):
    """Yields "t0", "t1", ... every few milliseconds, up to max_new_tokens."""

    def __init__(self) -> None:
        self.yielded = 0

    async def info(self) -> BackendInfo:
        return BackendInfo()

    async def healthy(self) -> bool:
        return True

    async def count_tokens(self, text: str) -> int | None:
        return len(text.split())

    async def generate_stream(self, prompt: str, params: Any, max_new_tokens: int) -> AsyncIterator[Any]:
        for i in range(max_new_tokens):
            await asyncio.sleep(0.002)
            self.yielded += 1
            yield StreamedToken(f" t{i}")
        yield GenerationResult("", "length", max_new_tokens)


class Frames:
    def __init__(self, job: GenerationJob | None = None, cancel_after: int | None = None) -> None:
        self.sent: list[BaseModel] = []
        self.job = job
        self.cancel_after = cancel_after

    async def __call__(self, frame: BaseModel) -> None:
        self.sent.append(frame)
        tokens = sum(isinstance(f, TokenFrame) for f in self.sent)
        if self.job is not None and tokens == self.cancel_after:
            self.job.cancel_requested = True  # the cancel arrived; its task.cancel() was lost


def job_for(backend: GenerationBackend, max_new_tokens: int = 200) -> GenerationJob:
    work = Work(
        message_id="m1",
        model_config_name=CONFIG.name,
        thread=[ChatTurn(role="user", content="count")],
        sampling_parameters=SamplingParameters(max_new_tokens=max_new_tokens),
    )
    return GenerationJob(work, backend=backend, prompts=PromptBuilder(CONFIG, backend), model_config=CONFIG)


async def test_a_cancel_whose_task_cancellation_was_lost_still_stops_the_job() -> None:
    backend = Counting()
    job = job_for(backend)
    frames = Frames(job, cancel_after=3)
    await asyncio.wait_for(job.run(frames), 10)
    result = frames.sent[-1]
    assert isinstance(result, GeneratedText)
    assert result.finish_reason == "cancelled"
    assert result.text == " t0 t1 t2"
    assert backend.yielded == 4  # stopped at the next token, not after 200


async def test_without_a_cancel_the_job_runs_to_its_length() -> None:
    backend = Counting()
    frames = Frames()
    await asyncio.wait_for(job_for(backend, max_new_tokens=20).run(frames), 10)
    result = frames.sent[-1]
    assert isinstance(result, GeneratedText) and result.finish_reason == "length"
    assert result.generated_tokens == 20


async def test_a_job_cancelled_before_its_task_starts_answers_and_frees_its_slot() -> None:
    """The server cancels a message in the same instant it sent it: the pool's task has not run yet.
    The job still answers "cancelled" (the server lets go of the message) and leaves the pool."""
    backend = Counting()
    job = job_for(backend)
    frames = Frames()
    pool = JobPool()
    pool.start(job, frames)
    pool.cancel("m1")  # before the loop ran the task's first step
    await asyncio.wait_for(pool.wait(), 10)
    assert len(pool) == 0
    result = frames.sent[-1]
    assert isinstance(result, GeneratedText) and result.finish_reason == "cancelled"
    assert backend.yielded == 0
