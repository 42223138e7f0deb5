"""A worker that starts its backends itself: one per GPU group with its CUDA_VISIBLE_DEVICES, a backend that
dies is restarted and the work it held is answered elsewhere; and the real bundled backend started by a
worker serves a quantization it made.

The GPU backends are stand-ins (tests/support/standin_launcher.py: the scripted fake backend behind
``text-generation-launcher``'s arguments, reporting how it was started on ``/info``); no GPU is needed.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.e2e.chat_api import tokens_text
from tests.support.fault_flows import final_of, new_api, queue, wait_state
from tests.support.processes import ManagedProcess
from tests.support.stacks import Stack

pytestmark = pytest.mark.slow

STANDIN = str(Path(__file__).resolve().parents[1] / "support" / "standin_launcher.py")


def workers_of(stack: Stack, model: str, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        models = httpx.get(f"{stack.url}/configs/model_configs", timeout=5).json()
        if any(m["name"] == model and m["worker_count"] == count for m in models):
            return
        time.sleep(0.2)
    raise AssertionError(f"{model} never had {count} workers")


def backend_ports(worker: ManagedProcess, count: int, timeout: float = 30) -> dict[str, int]:
    """The port of each managed backend by name, from the worker's log of their starts."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = dict(
            re.findall(
                r"starting backend (\S+?)(?: on GPUs \S+)?: .*?--port (\d+)", worker.log_path.read_text()
            )
        )
        if len(found) >= count:
            return {name: int(port) for name, port in found.items()}
        time.sleep(0.2)
    raise AssertionError(f"the worker did not start {count} backends:\n{worker.log_tail()}")


def info(port: int) -> dict:
    return httpx.get(f"http://127.0.0.1:{port}/info", timeout=5).json()


def test_two_gpus_two_backends_and_a_killed_one_restarts_and_its_work_completes(fault_stack, tmp_path):
    model = f"standin-{uuid.uuid4().hex[:6]}"
    models = tmp_path / "models"
    models.mkdir()
    (models / "standin.yaml").write_text(
        f"name: {model}\nmodel_id: org/standin\nbackend: tgi\ngpus_per_replica: 1\nquantization: awq\n"
        "max_total_length: 2000\nmax_input_length: 1000\nparallel_requests: 3\nchat_template_source: backend\n"
    )
    worker = fault_stack.start_worker(
        OASST_WORKER_MODEL_CONFIGS_DIR=str(models),
        OASST_WORKER_MODEL_CONFIG_NAME=model,
        OASST_WORKER_MANAGED_BACKEND="tgi",
        OASST_WORKER_GPU_IDS='["0", "1"]',
        OASST_WORKER_MANAGED_BACKEND_COMMAND=f'["{sys.executable}", "{STANDIN}"]',
        OASST_WORKER_MANAGED_RESTART_MIN_DELAY="0.5",
        OASST_WORKER_BACKEND_HEALTH_INTERVAL="0.3",
        OASST_WORKER_BACKEND_TOKEN_TIMEOUT="5",
    )
    try:
        workers_of(fault_stack, model, 2)
        ports = backend_ports(worker, 2)
        assert set(ports) == {"tgi-gpu0", "tgi-gpu1"}
        started = {name: info(port) for name, port in ports.items()}
        assert {name: i["cuda_visible_devices"] for name, i in started.items()} == {
            "tgi-gpu0": "0",
            "tgi-gpu1": "1",
        }
        for i in started.values():
            argv = " ".join(i["argv"])
            assert "--model-id org/standin" in argv and "--num-shard 1" in argv and "--quantize awq" in argv
            assert "--max-total-tokens 2000 --max-input-tokens 1000" in argv
            assert "--max-concurrent-requests 3" in argv

        api = new_api(fault_stack)
        chat_id, message_id = queue(api, model, "[[slow]] a long answer", max_new_tokens=200)
        seen = api.events(chat_id, message_id, limit=4)
        assert any(e.data["event_type"] == "token" for e in seen)
        busy = [
            name
            for name, port in ports.items()
            if httpx.get(f"http://127.0.0.1:{port}/stats").json()["active"]
        ]
        assert len(busy) == 1
        killed = busy[0]
        os.kill(started[killed]["pid"], signal.SIGKILL)

        rest = api.events(chat_id, message_id, last_event_id=[e.id for e in seen if e.id][-1])
        final = final_of(rest)
        assert final["event_type"] == "message", final
        message = final["message"]
        assert message["state"] == "complete" and message["attempts"] == 2
        # The text streamed before the kill is kept: the restarted backend's worker continues it.
        assert any(e.data["event_type"] == "continuation" for e in rest)
        assert tokens_text(seen + rest) == message["content"]

        # The killed backend is started again, on its port and GPU, and serves again.
        deadline = time.monotonic() + 30
        while True:
            try:
                again = info(ports[killed])
                if again["pid"] != started[killed]["pid"]:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, worker.log_tail()
            time.sleep(0.2)
        assert again["cuda_visible_devices"] == started[killed]["cuda_visible_devices"]
        log = worker.log_path.read_text()
        assert f"backend {killed} (pid {started[killed]['pid']}) exited (killed by SIGKILL)" in log
        assert f"restarting backend {killed}" in log
        workers_of(fault_stack, model, 2)
        for _ in range(3):  # both backends answer again
            chat_id, message_id = queue(api, model, "short", max_new_tokens=3)
            assert wait_state(api, chat_id, message_id, {"complete", "failed"}, 30)["state"] == "complete"
    finally:
        assert worker.stop() == 0
    # The worker stopped its backends with it.
    for port in ports.values():
        with pytest.raises(httpx.HTTPError):
            info(port)


def test_a_worker_starts_the_bundled_backend_with_a_quantization_it_makes(fault_stack, tmp_path):
    model = "SmolLM2-135M-Instruct-Q8_0"
    cache = tmp_path / "cache"
    worker = fault_stack.start_worker(
        OASST_WORKER_MODEL_CONFIG_NAME=model,
        OASST_WORKER_MANAGED_BACKEND="cpu",
        OASST_CPU_BACKEND_CACHE_DIR=str(cache),
        OASST_CPU_BACKEND_N_THREADS="1",
    )
    try:
        workers_of(fault_stack, model, 1, timeout=120)
        api = new_api(fault_stack)
        chat_id, message_id = queue(
            api, model, "What is the capital of France?", do_sample=False, max_new_tokens=12
        )
        final = final_of(api.events(chat_id, message_id))
        assert final["event_type"] == "message" and final["message"]["content"].strip()
        log = worker.log_path.read_text()
        assert "[cpu-0] " in log and "quantizing to q8_0: tensor 272/272" in log
        assert len(list(cache.glob("*.q8_0.gguf"))) == 1
    finally:
        assert worker.stop() == 0


async def test_switching_a_managed_backend_restarts_it_with_the_new_config_or_falls_back(tmp_path):
    from oasst_shared.model_registry import load_registry
    from oasst_worker.managed.launch import launch
    from oasst_worker.managed.model_manager import BackendTarget, ModelManager, SwitchError
    from oasst_worker.managed.supervisor import ManagedBackend
    from oasst_worker.settings import WorkerSettings
    from tests.support.processes import free_port

    models = tmp_path / "models"
    models.mkdir()
    (models / "fleet.yaml").write_text(
        "- {name: model-a, model_id: org/a, backend: tgi}\n"
        "- {name: model-b, model_id: org/b, backend: tgi, quantization: eetq}\n"
        "- {name: model-broken, model_id: org/c, backend: tgi, backend_args: [--fail-to-start]}\n"
    )
    registry = load_registry(models)
    port = free_port()
    settings = WorkerSettings(
        managed_backend="tgi", managed_backend_command=[sys.executable, STANDIN], model_configs_dir=models
    )
    exits: list[str] = []

    async def on_exit(reason: str) -> None:
        exits.append(reason)

    backend = ManagedBackend(
        "tgi-gpu0",
        launch(
            registry["model-a"],
            kind="tgi",
            host="127.0.0.1",
            port=port,
            gpus=["0"],
            command=settings.managed_backend_command,
        ),
        on_exit=on_exit,
        min_delay=0.2,
        max_delay=1.0,
        stop_timeout=10,
    )
    supervising = asyncio.create_task(backend.run())
    url = f"http://127.0.0.1:{port}"
    manager = ModelManager(
        settings,
        registry,
        registry["model-a"],
        [BackendTarget(url, backend)],
        ready_timeout=20,
        poll_interval=0.1,
    )
    try:
        assert await manager._healthy(url)
        assert info(port)["model_id"] == "org/a"
        await manager.switch("model-b")
        switched = info(port)
        assert switched["model_id"] == "org/b" and "--quantize eetq" in " ".join(switched["argv"])
        assert switched["cuda_visible_devices"] == "0"

        manager._ready_timeout = 3  # the broken config's launcher exits at once, again and again
        with pytest.raises(SwitchError) as failed:
            await manager.switch("model-broken")
        assert failed.value.serving == "model-b" and manager.current.name == "model-b"
        assert info(port)["model_id"] == "org/b"
        # A switch is not a crash; the broken launcher's exits were.
        assert exits and all("exit code 3" in reason for reason in exits)
        assert [c.name for c in manager.servable()] == ["model-a", "model-b", "model-broken"]

        # An unload stops the backend until the next load, which starts it with that load's config.
        crashes = len(exits)
        await manager.unload()
        assert not manager.loaded and backend.pid is None
        await asyncio.sleep(1.5)  # longer than a restart's delay: it is not restarted
        assert backend.pid is None and len(exits) == crashes
        with pytest.raises(httpx.HTTPError):
            info(port)
        await manager.switch("model-a")
        assert manager.loaded and info(port)["model_id"] == "org/a" and len(exits) == crashes
        # A load that fails after an unload has nothing to fall back to: the backend stays stopped.
        await manager.unload()
        with pytest.raises(SwitchError) as failed:
            await manager.switch("model-broken")
        assert failed.value.serving is None and not manager.loaded
        await asyncio.sleep(1.5)
        assert backend.pid is None
    finally:
        await backend.stop()
        supervising.cancel()
        await asyncio.gather(supervising, return_exceptions=True)
