"""Model configurations: what a worker serves, how its backend runs it, and how prompts for it are built.

A config is operator data: the built-ins below, merged with files (:mod:`oasst_shared.model_registry`).
Its fields act: ``quantization`` and ``dtype`` decide the weights the backend serves (the bundled CPU backend
makes a GGUF file of that type; TGI and vLLM get their own flags), ``max_total_length`` is the context
length, ``gpus_per_replica`` the GPU group of one backend, ``parallel_requests`` the jobs a worker runs at
once, ``backend`` and ``backend_args`` what a managed backend is started with, ``keep_alive`` how long an
idle model stays loaded. Which value each backend accepts is checked here, once, for every process.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from oasst_shared.sampling import SamplingParameters

ChatTemplateSource = Literal["backend", "inline", "chatml"]
# GGUF file types (llama.cpp's quantizer makes them: the bundled CPU backend), then the methods of TGI and
# vLLM (pre-quantized weights, or quantized by the backend at load), then two generic labels.
Quantization = Literal[
    "none",
    # GGUF types, most precise first (the CPU backend picks its source file in this order)
    "f32",
    "f16",
    "bf16",
    "q8_0",
    "q6_k",
    "q5_k_m",
    "q5_1",
    "q5_k_s",
    "q5_0",
    "q4_k_m",
    "q4_1",
    "q4_k_s",
    "q4_0",
    "q3_k_l",
    "q3_k_m",
    "q3_k_s",
    "q2_k",
    # what TGI or vLLM apply
    "awq",
    "gptq",
    "marlin",
    "exl2",
    "eetq",
    "fp8",
    "compressed-tensors",
    "bitsandbytes",
    "bitsandbytes-nf4",
    "bitsandbytes-fp4",
    "int8",
    "int4",
]
Dtype = Literal["auto", "float16", "bfloat16", "float32"]
ModelKind = Literal["generation", "embedding"]
# Which program serves the model: the bundled CPU backend (llama.cpp), text-generation-inference, vLLM, any
# other OpenAI-compatible server the operator runs, or the worker's own sentence encoder.
BackendName = Literal["cpu", "tgi", "vllm", "openai", "embedding"]

GGUF_TYPES: tuple[str, ...] = get_args(Quantization)[1:18]
GPU_METHODS: tuple[str, ...] = get_args(Quantization)[18:]
# What each backend applies; ``openai`` and ``embedding`` servers are the operator's: there the value is a
# label for users and operators, and any is accepted.
QUANTIZATION_BY_BACKEND: dict[str, frozenset[str]] = {
    "cpu": frozenset({"none", *GGUF_TYPES}),
    "tgi": frozenset({"none", *GPU_METHODS}),
    "vllm": frozenset(
        {
            "none",
            "awq",
            "gptq",
            "marlin",
            "fp8",
            "compressed-tensors",
            "bitsandbytes",
            "bitsandbytes-nf4",
            "int4",
        }
    ),
}
DTYPE_BY_BACKEND: dict[str, frozenset[str]] = {
    "cpu": frozenset(get_args(Dtype)),
    "tgi": frozenset({"auto", "float16", "bfloat16"}),  # the launcher's --dtype has no float32
    "vllm": frozenset(get_args(Dtype)),
}
# Backends a worker can start itself (and so pass arguments to).
MANAGED_BACKENDS = frozenset({"cpu", "tgi", "vllm"})
MAX_BACKEND_ARGS = 64
# What the chat API does with a newest message that, with the system prompt, is over the input limit.
ChatPromptOverflow = Literal["cut", "refuse"]


class ParameterConfig(BaseModel):
    """A named sampling preset offered to users of a model (the web frontend shows them)."""

    name: str = Field(description="The preset's name.")
    description: str = Field("", description="What the preset is for.")
    sampling_parameters: SamplingParameters = Field(
        default_factory=SamplingParameters, description="The preset's values."
    )


# For pydantic's patterns, which search with Rust's regex: its "$" is the end of the text (Python's re
# would also take a name ending in "\n"; re.fullmatch it there).
MODEL_NAME_PATTERN = r"^[A-Za-z0-9_.:/@+-]+$"


class ModelConfig(BaseModel):
    """One servable model. ``name`` is what clients ask for; ``model_id`` is what the backend loads.

    Lengths are in tokens. ``max_input_length`` bounds the rendered prompt (older turns are dropped
    to fit); ``max_total_length`` bounds prompt plus answer, and so caps ``max_new_tokens``. A newest
    message that does not fit with the system prompt even alone is cut from the left on the chat API
    (``chat_prompt_overflow``) and refused on the OpenAI-compatible API (``context_length_exceeded``).
    """

    model_config = ConfigDict(protected_namespaces=())

    name: str = Field(
        min_length=1,
        max_length=128,
        pattern=MODEL_NAME_PATTERN,
        description="What clients ask for; the key of the work queue.",
    )
    model_id: str = Field(
        min_length=1, description="What the backend loads (a Hugging Face model id or a file name)."
    )
    kind: ModelKind = Field("generation", description="`generation` (chat, completions) or `embedding`.")
    description: str = Field("", description="Shown to users choosing a model.")
    max_input_length: int = Field(
        default=1536, ge=16, description="Tokens of the rendered prompt; older turns are dropped to fit."
    )
    max_total_length: int = Field(
        default=2048, ge=32, description="Tokens of prompt plus answer; caps `max_new_tokens`."
    )
    chat_prompt_overflow: ChatPromptOverflow = Field(
        "cut",
        description="The chat API, when the newest message and the system prompt alone are over "
        "`max_input_length`: `cut` drops the start of the message until they fit (as the original "
        "Open-Assistant server cut prompts from the left); `refuse` refuses the answer at submission "
        "(400 `context_length_exceeded`, with both numbers). The OpenAI-compatible API always refuses.",
    )
    quantization: Quantization = Field(
        "none",
        description="The weights' type. `none`: the weights as they are. The bundled CPU backend makes a GGUF "
        "file of a GGUF type (`q8_0`, `q4_k_m`...) at load; TGI and vLLM get it as `--quantize`/"
        "`--quantization` (see docs/backends.md); for `openai` and `embedding` it is a label.",
    )
    dtype: Dtype = Field(
        "auto",
        description="The weights' float type where they are not quantized: TGI and vLLM `--dtype`; the CPU "
        "backend converts to F16/BF16/F32 when `quantization` is `none`. `auto`: as the model's files say.",
    )
    backend: BackendName = Field(
        "tgi",
        description="Which program serves the model: `cpu` (the bundled llama.cpp backend), `tgi`, `vllm`, "
        "`openai` (any OpenAI-compatible server you run) or `embedding` (the worker's own encoder). "
        "Default: `embedding` for embedding models, `cpu` for a GGUF quantization, else `tgi`.",
    )
    backend_args: list[str] = Field(
        default_factory=list,
        max_length=MAX_BACKEND_ARGS,
        description="Extra command-line arguments for a TGI or vLLM backend the worker starts itself "
        "(`text-generation-launcher`, `vllm serve`); the flags this config sets are refused here.",
    )
    model_path: str | None = Field(
        None,
        max_length=4096,
        description="The weights on the backend's machine: a GGUF file, or a folder of GGUF files, for the CPU "
        "backend (the highest-precision file is the source of a quantization); a Hugging Face model folder "
        "for TGI and vLLM (its `config.json` and `tokenizer_config.json` fill what this config leaves out). "
        "A relative path is relative to the config's file. Default: `model_id` (the CPU backend: its own "
        "model file).",
    )
    gpus_per_replica: int = Field(
        0,
        ge=0,
        le=64,
        description="GPUs one backend of this model uses (TGI `--num-shard`, vLLM `--tensor-parallel-size`): a "
        "worker given GPUs starts one backend per group of this many. Default: 1 for `tgi` and `vllm`, "
        "else 0.",
    )
    parallel_requests: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Jobs a worker runs at once for this model (TGI `--max-concurrent-requests`, vLLM "
        "`--max-num-seqs`); default: the worker's `max_parallel_requests`.",
    )
    keep_alive: float | None = Field(
        None,
        gt=0,
        le=30 * 24 * 3600,
        description="Seconds an idle model stays loaded before it may be unloaded; null: it stays loaded.",
    )
    price_per_million_prompt_tokens: float | None = Field(
        None,
        ge=0,
        le=1_000_000,
        description="US dollars per million prompt tokens, what money budgets (`budget_usd` of a key's or "
        "user's limits) charge; null: prompts of this model cost nothing. Read from the server's configs.",
    )
    price_per_million_completion_tokens: float | None = Field(
        None,
        ge=0,
        le=1_000_000,
        description="US dollars per million generated tokens, as `price_per_million_prompt_tokens`.",
    )
    chat_template_source: ChatTemplateSource = Field(
        "backend",
        description="Where the chat template comes from: the backend (GGUF metadata, `/info`), `chat_template` below, or the built-in ChatML.",
    )
    chat_template: str | None = Field(
        None, description="A Jinja chat template (Hugging Face convention), for `inline`."
    )
    bos_token: str = Field("", description="Passed to the chat template.")
    eos_token: str = Field("", description="Passed to the chat template.")
    stop_sequences: list[str] = Field(
        default_factory=list, description="Added to every request's stop sequences."
    )
    parameter_configs: list[ParameterConfig] = Field(
        default_factory=list, description="Named sampling presets offered to users; the first is the default."
    )

    @model_validator(mode="before")
    @classmethod
    def _defaults_by_kind_and_backend(cls, data: Any) -> Any:
        # Defaults that depend on other fields, filled in before validation so that they count as given
        # (model files never override them). An input length follows a given total length.
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "backend" not in data:
            # Also what a worker older than the field announces: its config is read as it meant it.
            if data.get("kind") == "embedding":
                data["backend"] = "embedding"
            else:
                data["backend"] = "cpu" if data.get("quantization") in GGUF_TYPES else "tgi"
        if "gpus_per_replica" not in data and data["backend"] in ("tgi", "vllm"):
            data["gpus_per_replica"] = 1
        if "max_total_length" in data and "max_input_length" not in data:
            total = data["max_total_length"]
            if isinstance(total, int) and not isinstance(total, bool):
                data["max_input_length"] = default_input_length(total)
        return data

    @model_validator(mode="after")
    def _check_lengths_and_template(self) -> ModelConfig:
        if self.max_input_length >= self.max_total_length:
            raise ValueError("max_input_length must be smaller than max_total_length")
        if self.chat_template_source == "inline" and not self.chat_template:
            raise ValueError("chat_template_source 'inline' needs chat_template")
        return self

    @model_validator(mode="after")
    def _check_backend_accepts(self) -> ModelConfig:
        backend = self.backend
        if (self.kind == "embedding") != (backend == "embedding"):
            raise ValueError(f"a {self.kind} model cannot have backend {backend!r}")
        allowed = QUANTIZATION_BY_BACKEND.get(backend)
        if allowed is not None and self.quantization not in allowed:
            raise ValueError(
                f"quantization {self.quantization!r} is not one backend {backend!r} applies; "
                f"it takes: {', '.join(sorted(allowed))}"
            )
        dtypes = DTYPE_BY_BACKEND.get(backend)
        if dtypes is not None and self.dtype not in dtypes:
            raise ValueError(
                f"dtype {self.dtype!r} is not one backend {backend!r} takes: {', '.join(sorted(dtypes))}"
            )
        if self.dtype != "auto" and self.quantization != "none" and backend in ("cpu", "tgi"):
            # TGI's launcher refuses --dtype with --quantize; a quantized GGUF file has no one float type.
            raise ValueError(f"backend {backend!r} takes dtype only with quantization 'none'")
        if self.backend_args and backend not in ("tgi", "vllm"):
            raise ValueError(
                "backend_args are for a TGI or vLLM backend the worker starts; the CPU backend's settings "
                "are its OASST_CPU_BACKEND_* variables"
                if backend == "cpu"
                else f"backend {backend!r} is not started by the worker: it takes no backend_args"
            )
        if backend == "cpu" and self.gpus_per_replica:
            raise ValueError("the bundled CPU backend uses no GPU: gpus_per_replica must be 0")
        if any(len(arg) > 1024 for arg in self.backend_args):
            raise ValueError("a backend argument is longer than 1024 characters")
        return self

    @property
    def explicit_fields(self) -> frozenset[str]:
        """The fields the config's author set: a model's own files may fill only the others."""
        return frozenset(self.model_fields_set)

    @property
    def compat_key(self) -> str:
        """Workers are interchangeable for a message when this key matches."""
        return self.name

    def cap_max_new_tokens(self, requested: int, prompt_tokens: int) -> int:
        """The most new tokens a request may get once its prompt is known (at least 1)."""
        return max(1, min(requested, self.max_total_length - prompt_tokens))


SMOLLM2_135M = ModelConfig(
    name="SmolLM2-135M-Instruct",
    model_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    description="SmolLM2 135M Instruct, Q4_1 GGUF, runs on a CPU (the bundled default)",
    max_input_length=1536,
    max_total_length=2048,
    quantization="q4_1",
    backend="cpu",
    chat_template_source="backend",
    eos_token="<|im_end|>",
    stop_sequences=["<|im_end|>"],
    parameter_configs=[
        ParameterConfig(
            name="default",
            description="Balanced sampling",
            sampling_parameters=SamplingParameters(
                temperature=0.7, top_p=0.95, top_k=50, repetition_penalty=1.1
            ),
        ),
        ParameterConfig(
            name="greedy",
            description="Deterministic (greedy) decoding",
            sampling_parameters=SamplingParameters(do_sample=False),
        ),
    ],
)

# The same model as a Q8_0 file, made from the shipped Q4_1 file by the CPU backend the first time it loads
# (llama.cpp's quantizer with requantizing allowed: the Q4_1 weights are expanded and quantized again, so
# the result carries Q4_1's error in a Q8_0 layout; a higher-precision source would avoid that).
SMOLLM2_135M_Q8 = ModelConfig.model_validate(
    {
        **SMOLLM2_135M.model_dump(exclude_unset=True),
        "name": "SmolLM2-135M-Instruct-Q8_0",
        "description": "SmolLM2 135M Instruct as Q8_0, quantized by the CPU backend at first use",
        "quantization": "q8_0",
    }
)

MINILM_EMBEDDING = ModelConfig(
    name="all-MiniLM-L6-v2",
    model_id="sentence-transformers/all-MiniLM-L6-v2",
    kind="embedding",
    description="Sentence embeddings, 384 dimensions",
    max_input_length=256,
    max_total_length=512,
)

# The built-ins; a registry (oasst_shared.model_registry) merges the operator's files over them.
MODEL_CONFIGS: dict[str, ModelConfig] = {c.name: c for c in (SMOLLM2_135M, SMOLLM2_135M_Q8, MINILM_EMBEDDING)}


def default_input_length(total: int) -> int:
    """The prompt's share of a context length nobody divided: three quarters (1536 of 2048)."""
    return max(16, min(total - 1, total * 3 // 4))


def get_model_config(name: str) -> ModelConfig:
    """Look up a built-in model config by name; ``KeyError`` names the known ones."""
    try:
        return MODEL_CONFIGS[name]
    except KeyError:
        raise KeyError(f"unknown model config {name!r}; known: {sorted(MODEL_CONFIGS)}") from None
