"""Model configurations: what a worker serves and how prompts for it are built."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from oasst_shared.sampling import SamplingParameters

ChatTemplateSource = Literal["backend", "inline", "chatml"]
Quantization = Literal["none", "q4_0", "q4_1", "q5_k_m", "q8_0", "int8", "int4", "awq", "gptq", "fp8"]
ModelKind = Literal["generation", "embedding"]
# What the chat API does with a newest message that, with the system prompt, is over the input limit.
ChatPromptOverflow = Literal["cut", "refuse"]


class ParameterConfig(BaseModel):
    """A named sampling preset offered to users of a model (the web frontend shows them)."""

    name: str = Field(description="The preset's name.")
    description: str = Field("", description="What the preset is for.")
    sampling_parameters: SamplingParameters = Field(
        default_factory=SamplingParameters, description="The preset's values."
    )


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
        pattern=r"^[A-Za-z0-9_.:/@+-]+$",
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
        "none", description="The weights' quantization, for users and operators."
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

    @model_validator(mode="after")
    def _check_lengths_and_template(self) -> ModelConfig:
        if self.max_input_length >= self.max_total_length:
            raise ValueError("max_input_length must be smaller than max_total_length")
        if self.chat_template_source == "inline" and not self.chat_template:
            raise ValueError("chat_template_source 'inline' needs chat_template")
        return self

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

MINILM_EMBEDDING = ModelConfig(
    name="all-MiniLM-L6-v2",
    model_id="sentence-transformers/all-MiniLM-L6-v2",
    kind="embedding",
    description="Sentence embeddings, 384 dimensions",
    max_input_length=256,
    max_total_length=512,
)

MODEL_CONFIGS: dict[str, ModelConfig] = {c.name: c for c in (SMOLLM2_135M, MINILM_EMBEDDING)}


def get_model_config(name: str) -> ModelConfig:
    """Look up a known model config by name; ``KeyError`` names the known ones."""
    try:
        return MODEL_CONFIGS[name]
    except KeyError:
        raise KeyError(f"unknown model config {name!r}; known: {sorted(MODEL_CONFIGS)}") from None
