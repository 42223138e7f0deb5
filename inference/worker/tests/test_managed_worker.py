"""The worker side of managed backends, in process: a dead backend's jobs are handed back at once, the
settings keep the adapter and the started backend consistent, and a config acts on the worker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from oasst_shared.model_configs import SMOLLM2_135M, ModelConfig
from oasst_shared.protocol import ChatTurn, Work, WorkerError, dump_frame
from oasst_shared.sampling import SamplingParameters
from oasst_shared.token_frames import TokenFrame
from oasst_worker.backends.protocols import GenerationBackend
from oasst_worker.backends.records import BackendInfo, StreamedToken
from oasst_worker.connection.client import WorkerClient
from oasst_worker.jobs.generation import GenerationJobFactory
from oasst_worker.settings import WorkerSettings

CONFIG = SMOLLM2_135M.model_copy(update={"chat_template_source": "chatml"})


class Hanging(GenerationBackend):
    """Sends one token, then nothing: a backend whose process died without closing its streams."""

    async def info(self) -> BackendInfo:
        return BackendInfo()

    async def healthy(self) -> bool:
        return True

    async def count_tokens(self, text: str) -> int | None:
        return len(text.split())

    async def generate_stream(self, prompt: str, params: Any, max_new_tokens: int) -> AsyncIterator[Any]:
        yield StreamedToken(" one")
        await asyncio.sleep(3600)


class Sender:
    def __init__(self) -> None:
        self.sent: list[BaseModel | TokenFrame] = []

    async def send(self, frame: BaseModel | TokenFrame) -> None:
        self.sent.append(frame)

    def queue_token(self, frame: TokenFrame) -> bool:
        self.sent.append(frame)
        return True


def work(message_id: str) -> str:
    return dump_frame(
        Work(
            message_id=message_id,
            model_config_name=CONFIG.name,
            thread=[ChatTurn(role="user", content="hello")],
            sampling_parameters=SamplingParameters(max_new_tokens=50),
        )
    )


async def test_a_lost_backend_hands_every_job_back_at_once() -> None:
    client = WorkerClient(WorkerSettings(max_parallel_requests=3), GenerationJobFactory(Hanging(), CONFIG))
    sender = Sender()
    client._sender = sender  # type: ignore[assignment]  # the connection's frame writer
    client._health.healthy = True
    for message_id in ("m1", "m2"):
        await client._handle(work(message_id))
    while sum(isinstance(f, TokenFrame) for f in sender.sent) < 2:
        await asyncio.sleep(0.01)
    assert client.free_slots == 1

    await client.backend_lost("the backend process exited (killed by SIGKILL)")

    errors = [f for f in sender.sent if isinstance(f, WorkerError)]
    assert sorted(e.message_id for e in errors) == ["m1", "m2"]
    assert all(e.retryable and "killed by SIGKILL" in e.error for e in errors)
    assert client.free_slots == 0  # no work until the backend's health check passes again
    await asyncio.sleep(0.05)
    assert [f for f in sender.sent if isinstance(f, WorkerError)] == errors  # nothing more from the jobs


def test_a_managed_backend_picks_its_adapter() -> None:
    assert WorkerSettings(managed_backend="vllm").backend_kind == "openai"
    assert WorkerSettings(managed_backend="cpu").backend_kind == "tgi"
    assert WorkerSettings(managed_backend="cpu").runs_backends == ("cpu",)
    assert WorkerSettings(backend_kind="tgi").runs_backends == ("tgi", "cpu")
    with pytest.raises(
        ValidationError, match="managed_backend 'vllm' is spoken to with backend_kind 'openai'"
    ):
        WorkerSettings(managed_backend="vllm", backend_kind="tgi")


def test_the_config_must_be_for_the_backend_the_worker_starts() -> None:
    settings = WorkerSettings(managed_backend="tgi")
    with pytest.raises(ValueError, match="is for backend 'cpu'; this worker starts 'tgi' backends"):
        settings.resolve_model_config()


def test_parallel_requests_of_the_config_win() -> None:
    settings = WorkerSettings(max_parallel_requests=2)
    assert settings.parallel_requests(CONFIG) == 2
    assert settings.parallel_requests(ModelConfig(name="m", model_id="m", parallel_requests=8)) == 8


class Reporting(Hanging):
    async def info(self) -> BackendInfo:
        return BackendInfo(
            max_input_length=8191, max_total_tokens=8192, chat_template="{{ x }}", eos_token="</s>"
        )


async def test_the_backend_fills_what_the_config_leaves_out() -> None:
    open_config = ModelConfig(name="m", model_id="m", backend="cpu")
    factory = GenerationJobFactory(Reporting(), open_config)
    await factory.prepare()
    resolved = factory.model_config
    assert (resolved.max_total_length, resolved.max_input_length) == (8192, 6144)
    assert (resolved.chat_template, resolved.eos_token) == ("{{ x }}", "</s>")
    # A config that sets them keeps them (the built-in's 2048 context).
    factory = GenerationJobFactory(Reporting(), SMOLLM2_135M)
    await factory.prepare()
    assert (
        factory.model_config.max_total_length == 2048
        and factory.model_config.chat_template_source == "backend"
    )
