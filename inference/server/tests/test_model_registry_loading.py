"""The server loads the operator's model configs at start: a bad file stops it before anything runs, and a
model named only in a file is known (a request for it waits for a worker instead of being unknown)."""

from __future__ import annotations

from pathlib import Path

import pytest
from asgi_lifespan import LifespanManager

from oasst_inference_server.main import create_app
from oasst_inference_server.settings import Settings
from oasst_shared.model_configs import SMOLLM2_135M
from oasst_shared.model_registry import ModelRegistryError


def settings(tmp_path: Path, models: Path) -> Settings:
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        environment="development",
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'server.db'}",
        model_configs_dir=models,
        recovery_interval=3600,
    )


def test_a_bad_model_config_stops_the_server_at_start(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "bad.yaml").write_text("name: m\nmodel_id: m\nbackend: tgi\ngpus_per_replica: -1\n")
    with pytest.raises(ModelRegistryError) as caught:
        create_app(settings(tmp_path, models))
    assert f"{models / 'bad.yaml'}: gpus_per_replica: Input should be greater than or equal to 0" in str(
        caught.value
    )


async def test_a_model_from_a_file_is_known_without_a_worker(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "llama.yaml").write_text("name: llama-awq\nmodel_id: org/llama-awq\nquantization: awq\n")
    app = create_app(settings(tmp_path, models))
    async with LifespanManager(app, startup_timeout=60, shutdown_timeout=30):
        registry = app.state.registry
        live = await registry.live_models()
        assert live == {}
        known = registry.known_model_names(live)
        assert "llama-awq" in known and SMOLLM2_135M.name in known
        assert "no-such-model" not in known
        assert app.state.model_registry["llama-awq"].quantization == "awq"
