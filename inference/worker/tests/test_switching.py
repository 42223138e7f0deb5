"""The protocol half of a model switch, in process (the real CPU backend runs in
cpu_backend/test_worker_switching.py): the order of its steps, refusals, a connection lost while it drains,
a worker that cannot switch, and a worker_info too large for a frame."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

from oasst_shared.model_configs import SMOLLM2_135M, SMOLLM2_135M_Q8, ModelConfig
from oasst_shared.protocol import (
    MAX_FRAME_BYTES,
    LoadModel,
    ModelSwitch,
    ServableModel,
    UnloadModel,
    WorkerInfo,
    dump_frame,
)
from oasst_worker.backends.records import BackendInfo
from oasst_worker.connection.client import WorkerClient
from oasst_worker.connection.handshake import worker_info
from oasst_worker.connection.switching import OnProgress, Steps, SwitchError, Switching, SwitchProgress
from oasst_worker.jobs.generation import GenerationJobFactory
from oasst_worker.settings import WorkerSettings
from tests.support.worker_jobs import OneToken

CONFIG = SMOLLM2_135M.model_copy(update={"chat_template_source": "chatml"})


class Sender:
    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.closed = False

    async def send(self, frame: BaseModel) -> None:
        self.sent.append(frame)


class Backend:
    """A BackendSwitcher that records what it was asked; ``fail`` makes a load fail, serving that."""

    def __init__(self, fail: SwitchError | None = None) -> None:
        self.current: ModelConfig = CONFIG
        self.loaded = True
        self.calls: list[str] = []
        self.fail = fail

    async def probe(self) -> None:
        self.calls.append("probe")

    def servable_models(self) -> list[ServableModel]:
        return [ServableModel(config=CONFIG), ServableModel(config=SMOLLM2_135M_Q8)]

    async def switch(self, name: str, on_progress: OnProgress) -> ModelConfig:
        self.calls.append(f"switch {name}")
        on_progress(SwitchProgress(name, "unloading"))
        if self.fail is not None:
            self.loaded = self.fail.serving is not None
            raise self.fail
        self.current = SMOLLM2_135M_Q8.model_copy(update={"chat_template_source": "chatml"})
        return self.current

    async def unload(self, on_progress: OnProgress) -> None:
        self.calls.append("unload")
        self.loaded = False


def client_with(backend: Backend) -> tuple[WorkerClient, Sender]:
    settings = WorkerSettings(max_parallel_requests=2)
    switching = Switching(backend, lambda s, c: GenerationJobFactory(OneToken(), c), settings)
    client = WorkerClient(settings, GenerationJobFactory(OneToken(), CONFIG), switching=switching)
    client._health.healthy = True
    sender = Sender()
    client._sender = sender  # type: ignore[assignment]  # the connection's frame writer
    return client, sender


async def settle(client: WorkerClient) -> None:
    if client._switch_task is not None:
        await client._switch_task
    for _ in range(5):
        await asyncio.sleep(0)


async def test_steps_go_forward_only_and_quantizing_repeats_as_it_advances() -> None:
    sender = Sender()
    steps = Steps("r", "m", sender)  # type: ignore[arg-type]
    await steps.send("draining")
    for step, done in [
        ("unloading", None),
        ("quantizing", 1),
        ("quantizing", 1),
        ("unloading", None),  # a poll that saw an earlier state
        ("quantizing", 5),
        ("ready", None),  # the switch says ready itself, after probing the backend
        ("loading", None),
        ("loading", None),
        ("quantizing", 6),
        ("starting", None),
    ]:
        steps.progress(SwitchProgress("m", step, done, 10 if done else None))
    await steps.send("ready")
    assert [(f.step, f.tensors_done) for f in sender.sent] == [
        ("draining", None),
        ("unloading", None),
        ("quantizing", 1),
        ("quantizing", 5),
        ("loading", None),
        ("starting", None),
        ("ready", None),
    ]


async def test_a_switch_ends_with_ready_and_the_new_model() -> None:
    backend = Backend()
    client, sender = client_with(backend)
    await client._handle(dump_frame(LoadModel(request_id="r", model_config_name=SMOLLM2_135M_Q8.name)))
    assert client.free_slots == 0 and client.switching is not None and client.switching.busy
    await settle(client)
    assert [f.step for f in sender.sent[:-1]] == ["draining", "unloading", "ready"]
    info = sender.sent[-1]
    assert info.type == "worker_info" and info.loaded and info.model_config_.name == SMOLLM2_135M_Q8.name
    assert client.factory.model_config.name == SMOLLM2_135M_Q8.name and client.free_slots == 2


async def test_loading_the_model_served_is_ready_at_once() -> None:
    backend = Backend()
    client, sender = client_with(backend)
    await client._handle(dump_frame(LoadModel(request_id="r", model_config_name=CONFIG.name)))
    await settle(client)
    assert [f.type for f in sender.sent] == ["model_switch", "worker_info"] and sender.sent[0].step == "ready"
    assert backend.calls == [] and client.free_slots == 2


async def test_a_failed_load_reports_what_is_served_then() -> None:
    backend = Backend(fail=SwitchError("the file is cut short", serving=None))
    client, sender = client_with(backend)
    await client._handle(dump_frame(LoadModel(request_id="r", model_config_name=SMOLLM2_135M_Q8.name)))
    await settle(client)
    *switch, info = sender.sent
    assert [f.step for f in switch] == ["draining", "unloading", "failed"]
    assert switch[-1].error == "the file is cut short"
    assert not info.loaded and info.model_config_.name == CONFIG.name  # the model it last served
    assert client.free_slots == 0


async def test_refusals_change_nothing() -> None:
    backend = Backend()
    client, sender = client_with(backend)
    await client._handle(dump_frame(LoadModel(request_id="unknown", model_config_name="nope")))
    await settle(client)
    refused, info = sender.sent  # then what is served, so the server ends the switch it began
    assert isinstance(refused, ModelSwitch) and refused.step == "failed" and "'nope'" in (refused.error or "")
    assert isinstance(info, WorkerInfo) and info.loaded and info.model_config_.name == CONFIG.name
    assert backend.calls == [] and client.free_slots == 2

    # A worker that cannot switch refuses every switch.
    plain = WorkerClient(WorkerSettings(), GenerationJobFactory(OneToken(), CONFIG))
    plain._sender = sender  # type: ignore[assignment]
    await plain._handle(dump_frame(UnloadModel(request_id="u")))
    await settle(plain)
    assert sender.sent[-2].step == "failed" and "cannot switch" in sender.sent[-2].error
    assert isinstance(sender.sent[-1], WorkerInfo)


async def test_a_switch_whose_connection_is_lost_while_it_drains_is_given_up() -> None:
    backend = Backend()
    client, sender = client_with(backend)
    release = asyncio.Event()
    client.finish_jobs = release.wait  # type: ignore[method-assign]  # a job still running
    await client._handle(dump_frame(LoadModel(request_id="r", model_config_name=SMOLLM2_135M_Q8.name)))
    await asyncio.sleep(0.01)
    sender.closed = True  # the connection is gone
    release.set()
    await settle(client)
    assert [f.step for f in sender.sent] == ["draining"]
    assert backend.calls == [] and client.switching is not None and not client.switching.busy


class Unanswering(OneToken):
    """A backend that does not answer its probe (it has only just started); notes that it was closed."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.closed = False

    async def info(self) -> BackendInfo:
        self.asked.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def close(self) -> None:
        self.closed = True


async def test_a_switch_cancelled_while_it_probes_closes_the_backend_it_made() -> None:
    probed = Unanswering()
    settings = WorkerSettings(max_parallel_requests=2)
    switching = Switching(Backend(), lambda s, c: GenerationJobFactory(probed, c), settings)
    client = WorkerClient(settings, GenerationJobFactory(OneToken(), CONFIG), switching=switching)
    client._health.healthy = True
    client._sender = Sender()  # type: ignore[assignment]
    await client._handle(dump_frame(LoadModel(request_id="r", model_config_name=SMOLLM2_135M_Q8.name)))
    await asyncio.wait_for(probed.asked.wait(), 5)
    task = client._switch_task
    assert task is not None
    task.cancel()  # the worker stops
    await asyncio.gather(task, return_exceptions=True)
    assert probed.closed  # never served: its connections are not left open
    assert client.factory.model_config.name == CONFIG.name


def test_a_worker_info_too_large_for_a_frame_leaves_out_servable_models_but_the_served_one() -> None:
    template = "x" * 100_000
    servable = [
        ServableModel(config=CONFIG.model_copy(update={"name": f"m{i:02}", "chat_template": template}))
        for i in range(20)
    ] + [ServableModel(config=CONFIG)]
    info = worker_info(WorkerSettings(), CONFIG, servable=servable)
    assert len(dump_frame(info)) <= MAX_FRAME_BYTES
    names = [s.config.name for s in info.servable]
    assert names[0] == CONFIG.name and 1 < len(names) < 21
