"""What the app serves with, built for each model it loads: settings, engine, scheduler, metrics, limits and
the ``/info`` answer. Between an unload and the next load there is none: requests get 503."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import llama_cpp
from fastapi import Request

from oasst_cpu_backend.engine import ModelEngine
from oasst_cpu_backend.loading import LoadedModel
from oasst_cpu_backend.metrics import BackendMetrics
from oasst_cpu_backend.scheduler import Scheduler, ShuttingDownError
from oasst_cpu_backend.schemas import Info
from oasst_cpu_backend.settings import Settings
from oasst_cpu_backend.validation import Limits


class ModelNotLoaded(ShuttingDownError):
    """No model is loaded right now (one is loading, or was unloaded): 503, retry elsewhere or later."""


def package_version() -> str:
    try:
        return version("oasst-inference-worker")
    except PackageNotFoundError:
        return "0.0.0"


@dataclass
class ServingState:
    settings: Settings
    engine: ModelEngine
    scheduler: Scheduler
    metrics: BackendMetrics
    limits: Limits
    info: Info
    model: LoadedModel


def build_serving(settings: Settings, model: LoadedModel) -> ServingState:
    """The serving state of a freshly loaded model (blocking: hashes the model file)."""
    engine = model.engine
    limits = Limits(
        n_ctx=engine.n_ctx,
        max_input_length=min(settings.effective_max_input_length, engine.n_ctx - 1),
        max_stop_sequences=settings.max_stop_sequences,
        max_top_n_tokens=settings.max_top_n_tokens,
    )
    metrics = BackendMetrics()
    scheduler = Scheduler(engine, metrics, settings.max_concurrent_requests)
    return ServingState(
        settings, engine, scheduler, metrics, limits, build_info(settings, model, limits), model
    )


def build_info(settings: Settings, model: LoadedModel, limits: Limits) -> Info:
    engine = model.engine
    metadata = engine.metadata
    return Info(
        model_id=model.plan.model_id,
        model_sha=file_sha256(engine.model_path),
        model_dtype=f"gguf:{engine.model_path.name}",
        model_config_name=model.plan.config.name if model.plan.config is not None else None,
        quantization=model.file_type,
        model_file_bytes=engine.model_path.stat().st_size,
        max_concurrent_requests=settings.max_concurrent_requests,
        max_stop_sequences=limits.max_stop_sequences,
        max_input_length=limits.max_input_length,
        max_input_tokens=limits.max_input_length,
        max_total_tokens=limits.n_ctx,
        max_top_n_tokens=limits.max_top_n_tokens,
        max_batch_size=engine.parallel_sequences,
        version=package_version(),
        llama_cpp_version=llama_cpp.__version__,
        chat_template=metadata.get("tokenizer.chat_template"),
        bos_token=engine.special_token_text("tokenizer.ggml.bos_token_id"),
        eos_token=engine.special_token_text("tokenizer.ggml.eos_token_id"),
        add_bos_token=metadata.get("tokenizer.ggml.add_bos_token", "false").lower() == "true",
    )


def file_sha256(path: Path) -> str:
    """The model file's hash: workers report it so that the server compares only workers of one model
    file (compliance checks). About 0.3 s for the default model, once at startup."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def serving_state(request: Request) -> ServingState:
    state: ServingState | None = getattr(request.app.state, "serving", None)
    if state is None:
        raise ModelNotLoaded("Model is not available: no model is loaded right now (see /health)")
    return state


def serving_state_if_ready(request: Request) -> ServingState | None:
    """None while the lifespan is still loading the model."""
    state: ServingState | None = getattr(request.app.state, "serving", None)
    return state
