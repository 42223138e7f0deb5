"""The worker's model manager switches a running CPU backend to another config of the registry, reporting
progress, and says what is served when a switch fails."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from oasst_cpu_backend.settings import default_model_path
from oasst_shared.model_configs import SMOLLM2_135M, SMOLLM2_135M_Q8
from oasst_shared.model_registry import load_registry
from oasst_worker.managed.model_manager import BackendTarget, ModelManager, SwitchError, SwitchProgress
from oasst_worker.settings import WorkerSettings

from .conftest import start_backend, stop_backend

pytestmark = pytest.mark.slow


async def test_switching_a_cpu_backend(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    with default_model_path().open("rb") as whole, (tmp_path / "cut.Q4_1.gguf").open("wb") as cut:
        cut.write(whole.read(50_000_000))
    (models / "cut.yaml").write_text(
        f"name: smol-cut\nmodel_id: cut\nbackend: cpu\nmodel_path: {tmp_path / 'cut.Q4_1.gguf'}\n"
    )
    (models / "tgi.yaml").write_text("name: on-tgi\nmodel_id: org/m\nbackend: tgi\n")
    backend = start_backend(
        tmp_path,
        OASST_CPU_BACKEND_MODEL_CONFIG_NAME=SMOLLM2_135M.name,
        OASST_CPU_BACKEND_MODEL_CONFIGS_DIR=str(models),
        OASST_CPU_BACKEND_CACHE_DIR=str(tmp_path / "cache"),
    )
    try:
        settings = WorkerSettings(backend_kind="tgi", backend_url=backend.url, model_configs_dir=models)
        registry = load_registry(models)
        manager = ModelManager(
            settings, registry, SMOLLM2_135M, [BackendTarget(backend.url)], poll_interval=0.05
        )
        # The operator's backend is switchable once its /info says it is the bundled CPU backend; a tgi
        # config is never servable there (nobody can restart the operator's TGI).
        assert manager.servable() == []
        await manager.probe()
        assert [c.name for c in manager.servable()] == sorted(
            [SMOLLM2_135M.name, SMOLLM2_135M_Q8.name, "smol-cut"]
        )
        [served] = [s for s in manager.servable_models() if s.config.name == SMOLLM2_135M.name]
        assert served.memory_bytes == default_model_path().stat().st_size and served.load_seconds is None

        seen: list[SwitchProgress] = []
        switched = await manager.switch(SMOLLM2_135M_Q8.name, seen.append)
        assert switched == SMOLLM2_135M_Q8 and manager.current == SMOLLM2_135M_Q8
        assert seen[0] == SwitchProgress(SMOLLM2_135M_Q8.name, "unloading")
        assert seen[-1] == SwitchProgress(SMOLLM2_135M_Q8.name, "ready")
        [q8] = [s for s in manager.servable_models() if s.config.name == SMOLLM2_135M_Q8.name]
        assert q8.memory_bytes and q8.memory_bytes > served.memory_bytes  # 8 bits a weight against 4.5
        assert q8.load_seconds is not None and q8.load_seconds > 0
        info = httpx.get(f"{backend.url}/info", timeout=30).json()
        assert (info["model_config_name"], info["quantization"]) == (SMOLLM2_135M_Q8.name, "q8_0")

        with pytest.raises(SwitchError) as failed:
            await manager.switch("smol-cut")
        assert failed.value.serving == SMOLLM2_135M_Q8.name  # the backend fell back to it
        assert manager.current == SMOLLM2_135M_Q8
        assert httpx.get(f"{backend.url}/health", timeout=30).json()["model"] == SMOLLM2_135M_Q8.name

        # The CPU backend at the URL is the operator's, not a TGI server: a tgi config is not switched to.
        with pytest.raises(KeyError, match="cannot serve 'on-tgi'"):
            await manager.switch("on-tgi")
        with pytest.raises(KeyError, match="unknown model config"):
            await manager.switch("nope")

        await manager.unload()
        assert not manager.loaded and manager.current == SMOLLM2_135M_Q8
        assert httpx.get(f"{backend.url}/health", timeout=30).json()["status"] == "unloaded"
        # Nothing to fall back to after an unload: a failed load leaves nothing loaded.
        with pytest.raises(SwitchError) as failed:
            await manager.switch("smol-cut")
        assert failed.value.serving is None and not manager.loaded
        await manager.switch(SMOLLM2_135M.name)
        assert manager.loaded and manager.current == SMOLLM2_135M
        await asyncio.sleep(0)
    finally:
        stop_backend(backend)
