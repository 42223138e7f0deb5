"""The backend the settings choose, for the model config the worker serves."""

from __future__ import annotations

from loguru import logger

from oasst_shared.model_configs import ModelConfig
from oasst_shared.protocol import WorkerCapabilities
from oasst_shared.schema_keywords import LLAMA_CPP_UNENFORCED
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
            response_format_style=settings.openai_response_format,
            token_timeout=settings.backend_token_timeout,
            generation_timeout=settings.backend_generation_timeout,
        )
    raise ValueError(f"backend kind {settings.backend_kind!r} does not generate text")


def create_embedding_backend(settings: WorkerSettings) -> EmbeddingBackend:
    from oasst_worker.backends.sentence_encoder import SentenceEncoder

    return SentenceEncoder(settings.embedding_model_path, device=settings.embedding_device)


def backend_capabilities(settings: WorkerSettings) -> WorkerCapabilities:
    """What the configured backend can honour, reported in the worker's first frame.

    TGI and the bundled CPU backend constrain output with TGI's ``grammar`` parameter (a JSON schema),
    which also makes tool calls valid, and return token logprobs with up to 5 alternatives (TGI's
    default ``max_top_n_tokens``); TGI's client refuses a zero or negative ``frequency_penalty`` and has
    no presence penalty. OpenAI-compatible servers take the OpenAI fields themselves: in ``chat`` mode
    all of them, in ``completions`` mode all but tools and ``response_format`` (not part of that API).
    A backend that completes a rendered prompt (TGI, the CPU backend, ``completions`` mode) continues an
    answer a lost worker started: its text goes after the prompt. A Messages API (``chat`` mode) cannot.
    """
    if settings.backend_kind == "tgi":
        grammar = settings.structured_output
        return WorkerCapabilities(
            structured_output=grammar,
            tools=grammar,
            logprobs=True,
            max_top_logprobs=5,
            frequency_penalty=True,
            # The bundled backend's converter; TGI's (outlines) enforces more, never less of these.
            unenforced_schema_keywords=list(LLAMA_CPP_UNENFORCED) if grammar else [],
            continue_answer=True,
        )
    if settings.backend_kind == "openai":
        chat = settings.openai_mode == "chat"
        return WorkerCapabilities(
            structured_output=chat,
            tools=chat,
            logprobs=True,
            max_top_logprobs=20 if chat else 5,
            frequency_penalty=True,
            presence_penalty=True,
            continue_answer=not chat,
        )
    return WorkerCapabilities()
