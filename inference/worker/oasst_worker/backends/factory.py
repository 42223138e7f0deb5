"""The backend the settings choose, for the model config the worker serves."""

from __future__ import annotations

from loguru import logger

from oasst_shared.model_configs import ModelConfig
from oasst_worker.backends.protocols import EmbeddingBackend, GenerationBackend
from oasst_worker.settings import WorkerSettings


def create_generation_backend(settings: WorkerSettings, config: ModelConfig) -> GenerationBackend:
    # The adapters are imported here so that a worker loads only the client library it uses.
    if settings.backend_kind == "tgi":
        from oasst_worker.backends.tgi import TgiBackend

        return TgiBackend(
            settings.backend_url,
            token_timeout=settings.backend_token_timeout,
            generation_timeout=settings.backend_generation_timeout,
        )
    if settings.backend_kind == "openai":
        from oasst_worker.backends.openai import OpenAiBackend

        if settings.openai_mode == "completions" and config.chat_template_source == "backend":
            logger.warning(
                "model config {}: OpenAI-compatible servers do not expose their chat template, so prompts "
                "are rendered with ChatML; set chat_template_source to 'chatml' or 'inline' (with the "
                "model's template), or OASST_WORKER_OPENAI_MODE=chat to let the server apply its own",
                config.name,
            )
        return OpenAiBackend(
            settings.backend_url,
            model=settings.backend_model or config.model_id,
            api_key=settings.backend_api_key,
            mode=settings.openai_mode,
            token_timeout=settings.backend_token_timeout,
            generation_timeout=settings.backend_generation_timeout,
        )
    raise ValueError(f"backend kind {settings.backend_kind!r} does not generate text")


def create_embedding_backend(settings: WorkerSettings) -> EmbeddingBackend:
    from oasst_worker.backends.sentence_encoder import SentenceEncoder

    return SentenceEncoder(settings.embedding_model_path, device=settings.embedding_device)
