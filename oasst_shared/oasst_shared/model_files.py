"""What a model's own files say about it, and a config completed with it: the config's own fields win.

The facts come from where the model lives: a Hugging Face model folder (``config.json``,
``tokenizer_config.json``; read here, for TGI and vLLM), a GGUF file's metadata (read by the CPU backend,
which has the ``gguf`` package), or what a running backend reports (``/info``). A config field its author
set (:attr:`ModelConfig.explicit_fields`) is never replaced; the others take the model's values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oasst_shared.model_configs import ModelConfig, default_input_length

MAX_JSON_BYTES = 16 << 20  # tokenizer_config.json files with long templates are a few hundred KiB

# torch_dtype values of config.json, as the config's dtype field names them.
_DTYPES = {"float16": "float16", "half": "float16", "bfloat16": "bfloat16", "float32": "float32"}
# quantization_config.quant_method values of config.json, as the config's quantization field names them.
_QUANT_METHODS = {
    "awq": "awq",
    "gptq": "gptq",
    "marlin": "marlin",
    "exl2": "exl2",
    "fp8": "fp8",
    "compressed-tensors": "compressed-tensors",
    "bitsandbytes": "bitsandbytes",
}


@dataclass(frozen=True)
class ModelFacts:
    """What is known of a model from its files or its backend; None where nothing says."""

    context_length: int | None = None
    max_input_length: int | None = None
    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    dtype: str | None = None
    quantization: str | None = None


def with_model_facts(config: ModelConfig, facts: ModelFacts) -> ModelConfig:
    """``config`` with the fields its author left out taken from ``facts`` (validated again)."""
    explicit = config.explicit_fields
    update: dict[str, Any] = {}
    if "max_total_length" not in explicit and facts.context_length:
        total = max(32, facts.context_length)
        update["max_total_length"] = total
        if "max_input_length" not in explicit:
            # The backend's input limit bounds the prompt; the answer keeps its quarter of the context.
            split = default_input_length(total)
            given = facts.max_input_length
            update["max_input_length"] = min(given, split) if given else split
    elif "max_input_length" not in explicit and facts.max_input_length:
        update["max_input_length"] = min(facts.max_input_length, config.max_input_length)
    if "chat_template_source" not in explicit and "chat_template" not in explicit and facts.chat_template:
        update["chat_template_source"] = "inline"
        update["chat_template"] = facts.chat_template
    if "bos_token" not in explicit and facts.bos_token:
        update["bos_token"] = facts.bos_token
    if "eos_token" not in explicit and facts.eos_token:
        update["eos_token"] = facts.eos_token
    if "quantization" not in explicit and facts.quantization:
        update["quantization"] = facts.quantization
    quantized = update.get("quantization", config.quantization) != "none"
    # A quantized model's float type is the backend's choice (TGI refuses --dtype with --quantize).
    if "dtype" not in explicit and facts.dtype in _DTYPES.values() and not quantized:
        update["dtype"] = facts.dtype
    if not update:
        return config
    data = config.model_dump(exclude_unset=True)
    # Filled fields stay "not given": a later source (the running backend) may still correct them.
    resolved = ModelConfig.model_validate({**data, **update})
    resolved.__pydantic_fields_set__.difference_update(set(update) - explicit)
    return resolved


def hf_folder_of(config: ModelConfig) -> Path | None:
    """The local Hugging Face model folder a TGI or vLLM config names (``model_path`` or ``model_id``)."""
    for candidate in (config.model_path, config.model_id):
        if candidate and (Path(candidate) / "config.json").is_file():
            return Path(candidate)
    return None


def read_hf_folder(folder: Path) -> ModelFacts:
    """The facts of a Hugging Face model folder's ``config.json`` and ``tokenizer_config.json``."""
    config = _json(folder / "config.json")
    tokenizer = _json(folder / "tokenizer_config.json")
    context = config.get("max_position_embeddings") or config.get("n_positions") or config.get("seq_length")
    quant = config.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    template = tokenizer.get("chat_template")
    if isinstance(template, list):  # several named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return ModelFacts(
        context_length=context if isinstance(context, int) and context > 0 else None,
        chat_template=template if isinstance(template, str) and template else None,
        bos_token=_token_text(tokenizer.get("bos_token")),
        eos_token=_token_text(tokenizer.get("eos_token")),
        dtype=_DTYPES.get(str(config.get("torch_dtype") or config.get("dtype") or "")),
        quantization=_QUANT_METHODS.get(str(method)) if method else None,
    )


def _json(path: Path) -> dict[str, Any]:
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            return {}
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _token_text(value: object) -> str | None:
    # tokenizer_config.json writes a special token as its text or as an AddedToken mapping.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None
