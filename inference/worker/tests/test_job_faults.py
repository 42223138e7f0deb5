"""A generation job's faults are told apart: text no frame may carry fails its message for good; a
backend that refuses before starting is reported as not the message's fault."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel

from oasst_shared.model_configs import SMOLLM2_135M
from oasst_shared.protocol import ChatTurn, Work, WorkerError
from oasst_shared.token_frames import TokenFrame
from oasst_worker.backends.protocols import GenerationBackend
from oasst_worker.backends.records import BackendError, BackendInfo, GenerationResult, StreamedToken
from oasst_worker.jobs.generation import GenerationJob
from oasst_worker.prompting import PromptBuilder

CONFIG = SMOLLM2_135M.model_copy(update={"chat_template_source": "chatml"})


class Frames:
    def __init__(self) -> None:
        self.sent: list[BaseModel] = []

    async def __call__(self, frame: BaseModel) -> None:
        self.sent.append(frame)


def job_for(backend: GenerationBackend) -> GenerationJob:
    work = Work(message_id="m1", model_config_name=CONFIG.name, thread=[ChatTurn(role="user", content="hi")])
    return GenerationJob(work, backend=backend, prompts=PromptBuilder(CONFIG, backend), model_config=CONFIG)


class Scripted(GenerationBackend):
    def __init__(self, items: list[Any]) -> None:
        self.items = items

    async def info(self) -> BackendInfo:
        return BackendInfo()

    async def healthy(self) -> bool:
        return True

    async def count_tokens(self, text: str) -> int | None:
        return len(text.split())

    async def generate_stream(self, prompt: str, params: Any, max_new_tokens: int) -> AsyncIterator[Any]:
        for item in self.items:
            if isinstance(item, Exception):
                raise item
            yield item


async def test_a_nul_in_the_backend_s_text_fails_the_message_without_a_retry() -> None:
    frames = Frames()
    backend = Scripted(
        [StreamedToken(" fine"), StreamedToken(" not\x00fine"), GenerationResult("", "length", 2)]
    )
    await job_for(backend).run(frames)
    assert [type(f).__name__ for f in frames.sent] == ["TokenFrame", "WorkerError"]
    error = frames.sent[-1]
    assert isinstance(error, WorkerError) and not error.retryable and not error.backend_unavailable
    assert "NUL" in error.error and isinstance(frames.sent[0], TokenFrame)


async def test_a_backend_refusal_is_reported_as_unavailable() -> None:
    frames = Frames()
    await job_for(Scripted([BackendError("HTTP 503: no slot", retryable=True, unavailable=True)])).run(frames)
    (error,) = frames.sent
    assert isinstance(error, WorkerError) and error.retryable and error.backend_unavailable


async def test_a_backend_failure_mid_answer_is_a_plain_retryable_error() -> None:
    frames = Frames()
    backend = Scripted([StreamedToken(" a"), BackendError("stream dropped", retryable=True)])
    await job_for(backend).run(frames)
    error = frames.sent[-1]
    assert isinstance(error, WorkerError) and error.retryable and not error.backend_unavailable


async def handle(client: Any, frame: BaseModel) -> list[BaseModel]:
    """Hand the client one server frame as if it came off the socket; return what it sends back."""
    import asyncio

    from oasst_shared.protocol import dump_frame

    frames = Frames()
    client._send = frames  # the socket edge
    await client._handle(dump_frame(frame))
    for _ in range(200):
        if frames.sent:
            break
        await asyncio.sleep(0.01)
    return frames.sent


async def test_a_backend_refusal_stops_the_worker_taking_work_but_a_full_worker_s_refusal_does_not() -> None:
    from oasst_worker.connection.client import WorkerClient
    from oasst_worker.jobs.generation import GenerationJobFactory
    from oasst_worker.settings import WorkerSettings

    refusing = Scripted([BackendError("HTTP 503", retryable=True, unavailable=True)])
    client = WorkerClient(WorkerSettings(), GenerationJobFactory(refusing, CONFIG))
    client._health.healthy = True
    work = Work(message_id="m1", model_config_name=CONFIG.name, thread=[ChatTurn(role="user", content="hi")])
    [error] = await handle(client, work)
    assert isinstance(error, WorkerError) and error.backend_unavailable
    assert not client._health.healthy and client.free_slots == 0  # until the health check passes

    client._health.healthy = True
    client._draining = True  # no free slot: the refusal says nothing about the backend
    [refusal] = await handle(client, work.model_copy(update={"message_id": "m2"}))
    assert isinstance(refusal, WorkerError) and refusal.backend_unavailable
    assert client._health.healthy


class Dying(Scripted):
    """A backend whose connection breaks mid-answer; ``alive`` is what its health check then says."""

    def __init__(self, alive: bool) -> None:
        super().__init__(
            [StreamedToken(" a"), BackendError("stream cut", retryable=True, connection_lost=True)]
        )
        self.alive = alive
        self.asked = 0

    async def healthy(self) -> bool:
        self.asked += 1
        return self.alive


async def test_a_backend_that_dies_mid_answer_is_reported_as_dead() -> None:
    frames = Frames()
    backend = Dying(alive=False)
    await job_for(backend).run(frames)
    error = frames.sent[-1]
    assert isinstance(error, WorkerError) and error.backend_died and error.retryable
    assert not error.backend_unavailable and "died" in error.error and backend.asked == 1


async def test_a_stream_cut_by_a_backend_that_still_answers_is_no_death() -> None:
    frames = Frames()
    backend = Dying(alive=True)
    await job_for(backend).run(frames)
    error = frames.sent[-1]
    assert isinstance(error, WorkerError) and error.retryable and not error.backend_died


async def test_other_failures_do_not_ask_whether_the_backend_died() -> None:
    frames = Frames()
    backend = Dying(alive=False)
    backend.items = [BackendError("the backend sent no token for 5s", retryable=True)]
    await job_for(backend).run(frames)
    [error] = frames.sent
    assert isinstance(error, WorkerError) and not error.backend_died and backend.asked == 0


async def test_a_dead_backend_stops_the_worker_taking_work() -> None:
    from oasst_worker.connection.client import WorkerClient
    from oasst_worker.jobs.generation import GenerationJobFactory
    from oasst_worker.settings import WorkerSettings

    client = WorkerClient(WorkerSettings(), GenerationJobFactory(Dying(alive=False), CONFIG))
    client._health.healthy = True
    work = Work(message_id="m1", model_config_name=CONFIG.name, thread=[ChatTurn(role="user", content="hi")])
    sent = await handle(client, work)
    for _ in range(200):
        if any(isinstance(f, WorkerError) for f in sent):
            break
        await asyncio.sleep(0.01)
    [error] = [f for f in sent if isinstance(f, WorkerError)]
    assert error.backend_died and not client._health.healthy and client.free_slots == 0


async def test_a_cancel_while_the_dead_backend_is_asked_still_answers_the_job() -> None:
    class SlowToTell(Dying):
        async def healthy(self) -> bool:
            await asyncio.sleep(30)
            return False

    frames = Frames()
    job = job_for(SlowToTell(alive=False))
    task = asyncio.create_task(job.run(frames))
    while not frames.sent:  # the token, then the job asks the backend
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    job.cancel_requested = True
    task.cancel()
    await task
    error = frames.sent[-1]
    assert isinstance(error, WorkerError) and error.message_id == "m1" and not error.backend_died
