"""From a model config to a loaded engine: which file, of which type, with which context, and making that
file first when the config asks for a quantization the sources do not have.

Outside the engine's generation loop on purpose: loading decides what the engine is built from, and the
engine only generates.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from oasst_cpu_backend.engine import ModelEngine
from oasst_cpu_backend.model_files import GgufFile, ModelFileError, source_files
from oasst_cpu_backend.quantize import QuantizeProgress, quantized
from oasst_cpu_backend.settings import ModelNotFoundError, Settings
from oasst_shared.model_configs import GGUF_TYPES, ModelConfig

_DTYPE_FILE_TYPES = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}


class LoadError(RuntimeError):
    """The model cannot be served: the config does not fit this backend, or its files are missing or bad."""


@dataclass(frozen=True)
class LoadPlan:
    """What to load: the config (None: the settings' ``model_path`` as it is), its sources and target."""

    config: ModelConfig | None
    model_id: str
    source: GgufFile
    # The GGUF type to serve; None: the source as it is.
    target: str | None
    n_ctx: int

    @property
    def name(self) -> str:
        return self.config.name if self.config is not None else self.model_id


@dataclass
class LoadProgress:
    """What ``/health`` says while a model loads."""

    model: str
    step: str = "reading"  # reading, quantizing, loading
    quantize: QuantizeProgress | None = None


@dataclass(frozen=True)
class LoadedModel:
    plan: LoadPlan
    engine: ModelEngine
    path: Path  # the file the engine serves (a cached quantization, or the source)
    file_type: str | None
    seconds: float


def plan_load(settings: Settings, config: ModelConfig | None) -> LoadPlan:
    """The plan for ``config`` on this backend (blocking: reads GGUF headers)."""
    try:
        if config is None:
            source = _best(settings.resolved_model_path(), None)
            return LoadPlan(None, settings.model_id, source, None, settings.n_ctx)
        if config.backend != "cpu":
            raise LoadError(
                f"model config {config.name!r} is for backend {config.backend!r}, not the CPU backend"
            )
        target = _target_type(config)
        path = Path(config.model_path) if config.model_path else settings.resolved_model_path()
        source = _best(path, target)
    except (ModelFileError, ModelNotFoundError) as exc:
        raise LoadError(str(exc)) from None
    if "max_total_length" in config.explicit_fields:
        n_ctx = config.max_total_length
    else:
        # The setting bounds memory; the model's trained context bounds what makes sense.
        n_ctx = min(settings.n_ctx, source.context_length or settings.n_ctx)
    return LoadPlan(config, config.model_id, source, target, n_ctx)


def load(plan: LoadPlan, settings: Settings, progress: LoadProgress) -> LoadedModel:
    """Make the file the plan names if it must be made, then load it (blocking: run it in a thread)."""
    started = time.monotonic()
    path, file_type = plan.source.path, plan.source.file_type
    if plan.target is not None and plan.target != plan.source.file_type:
        progress.step = "quantizing"
        progress.quantize = QuantizeProgress()
        path = quantized(
            plan.source,
            plan.target,
            settings.cache_dir,
            threads=settings.n_threads,
            progress=progress.quantize,
        )
        file_type = plan.target
    progress.step = "loading"
    engine = ModelEngine(
        path,
        n_ctx=plan.n_ctx,
        n_threads=settings.n_threads,
        n_threads_batch=settings.n_threads_batch,
        n_batch=settings.n_batch,
        prefill_chunk_tokens=settings.prefill_chunk_tokens,
        prefix_cache=settings.prefix_cache,
        parallel_sequences=settings.parallel_sequences,
        kv_budget_tokens=settings.kv_budget_tokens,
    )
    seconds = time.monotonic() - started
    logger.info(
        "model {} ready in {:.1f}s: {} ({})", plan.name, seconds, path.name, file_type or "unknown type"
    )
    return LoadedModel(plan, engine, path, file_type, seconds)


def _best(path: Path, target: str | None) -> GgufFile:
    """A file of the target type if there is one, else the most precise: the best source to make it from."""
    files = source_files(path)
    exact = [f for f in files if target is not None and f.file_type == target]
    if len(files) > 1:
        logger.info("model files in {}: {}", path, ", ".join(f.describe() for f in files))
    return exact[0] if exact else files[0]


def _target_type(config: ModelConfig) -> str | None:
    if config.quantization in GGUF_TYPES:
        return config.quantization
    if config.quantization == "none" and config.dtype != "auto":
        return _DTYPE_FILE_TYPES[config.dtype]
    return None
