"""Running a worker's jobs in process: a backend that answers one token, a recorder of the frames a job
sends, and a generation job run to its result."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel

from oasst_shared.model_configs import ModelConfig
from oasst_shared.protocol import GeneratedText, Work
from oasst_shared.token_frames import TokenFrame
from oasst_worker.backends.protocols import GenerationBackend
from oasst_worker.backends.records import BackendInfo, GenerationResult, StreamedToken
from oasst_worker.jobs.generation import GenerationJob
from oasst_worker.prompting import PromptBuilder


class OneToken(GenerationBackend):
    """Healthy, counts every text as one token, answers "x" (one token, finish reason length)."""

    async def info(self) -> BackendInfo:
        return BackendInfo()

    async def healthy(self) -> bool:
        return True

    async def count_tokens(self, text: str) -> int | None:
        return 1

    async def generate_stream(self, prompt: str, params: Any, max_new_tokens: int) -> AsyncIterator[Any]:
        yield StreamedToken("x")
        yield GenerationResult("x", "length", 1)


class Frames:
    """A job's ``send``: every frame, in order."""

    def __init__(self) -> None:
        self.sent: list[BaseModel | TokenFrame] = []

    async def __call__(self, frame: BaseModel | TokenFrame) -> None:
        self.sent.append(frame)


async def run_generation(backend: GenerationBackend, work: Work, config: ModelConfig) -> Frames:
    """Run ``work``'s generation job on ``backend`` (within 10 s); its frames, the last its result."""
    job = GenerationJob(work, backend=backend, prompts=PromptBuilder(config, backend), model_config=config)
    frames = Frames()
    await asyncio.wait_for(job.run(frames), 10)
    assert isinstance(frames.sent[-1], GeneratedText), frames.sent
    return frames
