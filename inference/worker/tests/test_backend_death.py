"""A backend that dies mid-request is told apart from one that only cut the stream, through the real TGI
client against the scripted backend (a process of its own: ``[[die]]`` makes it exit mid-answer,
``[[drop]]`` cuts one stream and lives on)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from oasst_shared.model_configs import SMOLLM2_135M
from oasst_shared.protocol import ChatTurn, Work, WorkerError
from oasst_worker.backends.tgi import TgiBackend
from oasst_worker.jobs.generation import GenerationJob
from oasst_worker.prompting import PromptBuilder
from tests.support.fake_workers import FakeBackend, start_fake_backend

pytestmark = pytest.mark.slow

CONFIG = SMOLLM2_135M.model_copy(update={"chat_template_source": "chatml"})


@pytest.fixture
def backend_process(tmp_path: Path) -> Iterator[FakeBackend]:
    backend = start_fake_backend(tmp_path)
    yield backend
    backend.process.stop()


async def run(url: str, prompt: str) -> WorkerError:
    backend = TgiBackend(url, token_timeout=10, generation_timeout=30)
    work = Work(
        message_id="m1", model_config_name=CONFIG.name, thread=[ChatTurn(role="user", content=prompt)]
    )
    job = GenerationJob(work, backend=backend, prompts=PromptBuilder(CONFIG, backend), model_config=CONFIG)
    sent: list[BaseModel] = []

    async def send(frame: BaseModel) -> None:
        sent.append(frame)

    try:
        await job.run(send)
    finally:
        await backend.close()
    error = sent[-1]
    assert isinstance(error, WorkerError) and error.message_id == "m1"
    return error


async def test_a_backend_that_exits_mid_answer_died_of_the_message(backend_process: FakeBackend) -> None:
    error = await run(backend_process.url, "[[die]] now")
    assert error.backend_died and error.retryable and not error.backend_unavailable
    assert backend_process.process.proc.wait(timeout=10) == 3  # it really exited


async def test_a_stream_cut_by_a_backend_that_lives_is_a_plain_retry(backend_process: FakeBackend) -> None:
    error = await run(backend_process.url, "[[drop]] please")
    assert error.retryable and not error.backend_died
    assert backend_process.process.alive()


async def test_a_backend_already_down_refuses_before_the_work(backend_process: FakeBackend) -> None:
    backend_process.process.kill()
    error = await run(backend_process.url, "hello")
    assert error.backend_unavailable and not error.backend_died
