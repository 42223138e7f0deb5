"""The engine's inputs and outputs: a validated generation request, its sampling, the tokens it streams
and its result. Plain values, shared by the engine, the scheduler and the HTTP layer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["length", "eos_token", "stop_sequence"]
Status = Literal["finished", "cancelled", "timeout", "queue_timeout"]


@dataclass(frozen=True)
class Sampling:
    """Sampling as llama.cpp understands it; temperature 0 means greedy."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    typical_p: float = 1.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    grammar: str | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class EngineRequest:
    prompt_tokens: list[int]
    max_new_tokens: int
    sampling: Sampling
    stop: list[str] = field(default_factory=list)
    top_n_tokens: int = 0
    # time.monotonic() values
    enqueued_at: float = 0.0
    queue_deadline: float = float("inf")
    deadline: float = float("inf")


@dataclass(frozen=True)
class TokenOut:
    id: int
    text: str
    logprob: float | None
    special: bool


@dataclass(frozen=True)
class Summary:
    finish_reason: FinishReason
    generated_tokens: int
    generated_text: str
    seed: int | None


@dataclass(frozen=True)
class Step:
    """One streamed token; the last one of a finished generation carries the summary."""

    token: TokenOut
    top_tokens: list[TokenOut] | None
    summary: Summary | None = None


@dataclass
class EngineResult:
    status: Status
    steps: list[Step] = field(default_factory=list)
    summary: Summary | None = None
    generated_tokens: int = 0
    prompt_tokens: int = 0
    reused_prompt_tokens: int = 0
    started_at: float | None = None
    first_token_at: float | None = None
    finished_at: float = 0.0
