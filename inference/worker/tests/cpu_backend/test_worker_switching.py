"""Protocol 6, the worker's half, end to end: a real worker (wired as ``oasst-worker`` wires it) in front of
the real CPU backend, connected to a scripted server. It announces what it can serve; on ``load_model`` it
drains (the answer in flight finishes whole, a cancel still works), reports each step, re-announces with the
new model and serves it; an unknown model or a second switch is refused without changing anything; an
unload leaves it serving nothing until the next load; a load that fails falls back to the previous model."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from oasst_cpu_backend.settings import default_model_path
from oasst_shared.model_configs import SMOLLM2_135M, SMOLLM2_135M_Q8
from oasst_shared.protocol import (
    AnyWorkerFrame,
    Cancel,
    ChatTurn,
    GeneratedText,
    LoadModel,
    ModelSwitch,
    Ping,
    Pong,
    UnloadModel,
    Work,
    WorkerError,
    WorkerInfo,
)
from oasst_shared.sampling import SamplingParameters
from oasst_worker.__main__ import build_clients, model_config
from oasst_worker.connection.client import WorkerClient
from oasst_worker.connection.switching import STEP_ORDER
from oasst_worker.managed.model_manager import ModelManager
from oasst_worker.settings import WorkerSettings
from tests.support.scripted_server import ScriptedPeer, ScriptedServer, tokens_of

from .conftest import RunningBackend, start_backend, stop_backend

pytestmark = pytest.mark.slow

TIMEOUT = 60


def work(message_id: str, max_new_tokens: int = 8, content: str = "What is the capital of France?") -> Work:
    return Work(
        message_id=message_id,
        model_config_name=SMOLLM2_135M.name,
        thread=[ChatTurn(role="user", content=content)],
        sampling_parameters=SamplingParameters(do_sample=False, max_new_tokens=max_new_tokens),
    )


def steps(frames: list[AnyWorkerFrame], request_id: str) -> list[ModelSwitch]:
    return [f for f in frames if isinstance(f, ModelSwitch) and f.request_id == request_id]


def index(frames: list[AnyWorkerFrame], match: object) -> int:
    return next(i for i, f in enumerate(frames) if f is match)


def health(backend: RunningBackend) -> dict[str, object]:
    body: dict[str, object] = httpx.get(f"{backend.url}/health", timeout=TIMEOUT).json()
    return body


async def answered(peer: ScriptedPeer, message_id: str) -> GeneratedText:
    await peer.send(work(message_id))
    frames = await peer.until(lambda f: getattr(f, "message_id", None) == message_id and f.type != "token")
    result = frames[-1]
    assert isinstance(result, GeneratedText), result
    assert result.text and result.text == "".join(tokens_of(frames, message_id))
    return result


async def pong(peer: ScriptedPeer, ping_id: str) -> Pong:
    await peer.send(Ping(ping_id=ping_id))
    frames = await peer.until(lambda f: isinstance(f, Pong) and f.ping_id == ping_id)
    assert not [f for f in frames[:-1] if isinstance(f, (WorkerInfo, ModelSwitch))], frames
    reply = frames[-1]
    assert isinstance(reply, Pong)
    return reply


def assert_in_order(switch: list[ModelSwitch], last: str) -> None:
    """Draining first, each step once (quantizing again as its tensors advance), never back, ``last`` last."""
    names = [s.step for s in switch]
    assert names[0] == "draining" and names[-1] == last and names.count(last) == 1, names
    ranks = [STEP_ORDER.index(n) for n in names[:-1]]
    assert ranks == sorted(ranks), names
    assert all(a != b or a == "quantizing" for a, b in zip(names, names[1:], strict=False)), names


@asynccontextmanager
async def worker_of(
    backend: RunningBackend, models: Path | None = None
) -> AsyncIterator[tuple[ScriptedPeer, WorkerClient]]:
    async with ScriptedServer() as server:
        settings = WorkerSettings(
            server_url=server.url,
            backend_url=backend.url,
            model_configs_dir=models,
            max_parallel_requests=2,
            backend_health_interval=0.2,
        )
        registry = settings.registry()
        [client], fleet = build_clients(settings, registry, model_config(settings, registry))
        assert fleet is None and client.switching is not None
        manager = client.switching.backend
        assert isinstance(manager, ModelManager)
        manager.poll_interval = 0.05  # to see the quantizer's progress on a fast machine too
        running = asyncio.create_task(client.run())
        try:
            yield await server.accept(), client
        finally:
            await asyncio.wait_for(client.drain(), TIMEOUT)
            await asyncio.wait_for(running, TIMEOUT)
            await client.factory.backend.close()


async def test_the_worker_switches_models_when_the_server_asks(tmp_path: Path) -> None:
    backend = start_backend(
        tmp_path,
        OASST_CPU_BACKEND_MODEL_CONFIG_NAME=SMOLLM2_135M.name,
        OASST_CPU_BACKEND_CACHE_DIR=str(tmp_path / "cache"),
    )
    try:
        async with worker_of(backend) as (peer, client):
            first = await peer.receive()
            assert isinstance(first, WorkerInfo) and first.loaded
            assert first.model_config_.name == SMOLLM2_135M.name
            servable = {s.config.name: s for s in first.servable}
            assert sorted(servable) == [SMOLLM2_135M.name, SMOLLM2_135M_Q8.name]
            assert servable[SMOLLM2_135M.name].memory_bytes == default_model_path().stat().st_size
            assert servable[SMOLLM2_135M_Q8.name].memory_bytes is None  # not made yet: not known
            assert all(s.load_seconds is None for s in first.servable)

            # Two answers in flight, then a switch: the one streaming finishes whole, the other is
            # cancelled meanwhile; new work, a ping and a second switch are answered at once.
            story = "Write a long story about a dragon who learns to bake bread."
            await peer.send(work("long", max_new_tokens=60, content=story))
            await peer.send(work("cancelled", max_new_tokens=200, content=story))
            await peer.until(lambda f: bool(tokens_of([f], "long")))
            await peer.send(LoadModel(request_id="to-q8", model_config_name=SMOLLM2_135M_Q8.name))
            await peer.send(Ping(ping_id="while-draining"))
            await peer.send(LoadModel(request_id="second", model_config_name=SMOLLM2_135M.name))
            await peer.send(work("refused"))
            await peer.send(Cancel(message_id="cancelled"))
            frames = await peer.until(lambda f: isinstance(f, WorkerInfo))

            [busy] = [f for f in frames if isinstance(f, Pong)]
            assert busy.free_slots == 0 and busy.backend_healthy
            [second] = steps(frames, "second")
            assert second.step == "failed" and second.error == "a switch is in progress"
            [refused] = [f for f in frames if isinstance(f, WorkerError)]
            assert refused.message_id == "refused" and refused.retryable and refused.backend_unavailable
            assert "switching models" in refused.error
            results = {f.message_id: f for f in frames if isinstance(f, GeneratedText)}
            assert results["cancelled"].finish_reason == "cancelled"
            long = results["long"]
            assert long.finish_reason in ("length", "eos_token") and long.generated_tokens > 1
            assert long.text == "".join(tokens_of(peer.received, "long"))

            switch = steps(frames, "to-q8")
            assert_in_order(switch, "ready")
            assert all(s.model_config_name == SMOLLM2_135M_Q8.name for s in switch)
            unloading = next(s for s in switch if s.step == "unloading")
            # Nothing in flight is cut: both answers end before the backend unloads.
            assert index(frames, switch[0]) < index(frames, long) < index(frames, unloading)
            assert index(frames, results["cancelled"]) < index(frames, unloading)
            quantizing = [s for s in switch if s.step == "quantizing"]
            counted = [s for s in quantizing if s.tensors_total is not None]
            assert counted and all(
                s.tensors_done is not None and s.tensors_done <= s.tensors_total for s in counted
            )
            assert [s.tensors_done for s in counted] == sorted({s.tensors_done for s in counted})
            info = frames[-1]
            assert isinstance(info, WorkerInfo) and index(frames, switch[-1]) == len(frames) - 2
            assert info.loaded and info.model_config_.name == SMOLLM2_135M_Q8.name
            # Probed again: another file, so another revision; what the load cost is announced.
            assert info.backend_model_revision and info.backend_model_revision != first.backend_model_revision
            q8 = {s.config.name: s for s in info.servable}[SMOLLM2_135M_Q8.name]
            assert q8.memory_bytes and q8.memory_bytes > servable[SMOLLM2_135M.name].memory_bytes  # type: ignore[operator]
            assert q8.load_seconds and q8.load_seconds > 0

            assert (await pong(peer, "after")).free_slots == 2
            await answered(peer, "on-q8")
            assert health(backend)["model"] == SMOLLM2_135M_Q8.name

            # An unknown model: one failed step and a worker_info of what is served, nothing changes.
            await peer.send(LoadModel(request_id="unknown", model_config_name="nope"))
            failed, same = await peer.until(lambda f: isinstance(f, WorkerInfo))
            assert (
                isinstance(failed, ModelSwitch) and failed.step == "failed" and failed.request_id == "unknown"
            )
            assert isinstance(same, WorkerInfo) and same.loaded
            assert same.model_config_.name == SMOLLM2_135M_Q8.name
            assert failed.error and "'nope'" in failed.error and SMOLLM2_135M_Q8.name in failed.error
            assert (await pong(peer, "unchanged")).free_slots == 2
            assert health(backend)["model"] == SMOLLM2_135M_Q8.name

            # Unload: the worker serves nothing, says so, and takes no work.
            await peer.send(UnloadModel(request_id="unload"))
            frames = await peer.until(lambda f: isinstance(f, WorkerInfo))
            assert [s.step for s in steps(frames, "unload")] == ["draining", "unloading", "ready"]
            assert all(s.model_config_name == SMOLLM2_135M_Q8.name for s in steps(frames, "unload"))
            unloaded = frames[-1]
            assert isinstance(unloaded, WorkerInfo) and not unloaded.loaded
            assert unloaded.model_config_.name == SMOLLM2_135M_Q8.name and unloaded.servable
            assert health(backend)["status"] == "unloaded"
            await asyncio.sleep(0.5)  # a health poll or two: the backend's 503 is not a fault now
            idle = await pong(peer, "unloaded")
            assert idle.free_slots == 0 and idle.backend_healthy
            await peer.send(work("nothing-loaded"))
            [error] = await peer.until(lambda f: isinstance(f, WorkerError))
            assert isinstance(error, WorkerError) and error.retryable and "no model loaded" in error.error

            # And a load again.
            await peer.send(LoadModel(request_id="again", model_config_name=SMOLLM2_135M.name))
            frames = await peer.until(lambda f: isinstance(f, WorkerInfo))
            again = steps(frames, "again")
            assert_in_order(again, "ready")
            assert "unloading" not in [s.step for s in again]  # nothing was loaded
            reloaded = frames[-1]
            assert isinstance(reloaded, WorkerInfo) and reloaded.loaded
            assert reloaded.model_config_.name == SMOLLM2_135M.name
            assert reloaded.backend_model_revision == first.backend_model_revision
            assert (await pong(peer, "serving")).free_slots == 2
            await answered(peer, "on-smol")
            assert client.free_slots == 2
    finally:
        stop_backend(backend)


async def test_a_load_that_fails_leaves_the_previous_model_served(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    with default_model_path().open("rb") as whole, (tmp_path / "cut.Q4_1.gguf").open("wb") as cut:
        cut.write(whole.read(50_000_000))  # a header that promises more than the file holds
    (models / "broken.yaml").write_text(
        f"- {{name: smol-cut, model_id: cut, backend: cpu, model_path: {tmp_path / 'cut.Q4_1.gguf'}}}\n"
        f"- {{name: smol-missing, model_id: gone, backend: cpu, model_path: {tmp_path / 'gone.gguf'}}}\n"
    )
    backend = start_backend(
        tmp_path,
        OASST_CPU_BACKEND_MODEL_CONFIG_NAME=SMOLLM2_135M.name,
        OASST_CPU_BACKEND_MODEL_CONFIGS_DIR=str(models),
        OASST_CPU_BACKEND_CACHE_DIR=str(tmp_path / "cache"),
    )
    try:
        async with worker_of(backend, models) as (peer, _):
            first = await peer.receive()
            assert isinstance(first, WorkerInfo)
            assert {s.config.name for s in first.servable} >= {"smol-cut", "smol-missing", SMOLLM2_135M.name}

            # The backend unloads, the load fails, the backend loads the previous model again.
            await peer.send(LoadModel(request_id="cut", model_config_name="smol-cut"))
            frames = await peer.until(lambda f: isinstance(f, WorkerInfo))
            switch = steps(frames, "cut")
            assert_in_order(switch, "failed")
            assert "unloading" in [s.step for s in switch]
            assert switch[-1].error and "smol-cut" in switch[-1].error
            info = frames[-1]
            assert isinstance(info, WorkerInfo) and info.loaded
            assert info.model_config_.name == SMOLLM2_135M.name
            assert info.backend_model_revision == first.backend_model_revision
            assert health(backend)["model"] == SMOLLM2_135M.name
            await answered(peer, "after-the-fallback")

            # A file that is not there: refused by the backend before it unloads anything.
            await peer.send(LoadModel(request_id="missing", model_config_name="smol-missing"))
            frames = await peer.until(lambda f: isinstance(f, WorkerInfo))
            assert [s.step for s in steps(frames, "missing")] == ["draining", "failed"]
            assert "gone.gguf" in (steps(frames, "missing")[-1].error or "")
            info = frames[-1]
            assert (
                isinstance(info, WorkerInfo) and info.loaded and info.model_config_.name == SMOLLM2_135M.name
            )
            assert (await pong(peer, "still-serving")).free_slots == 2
            await answered(peer, "after-the-refusal")
    finally:
        stop_backend(backend)
