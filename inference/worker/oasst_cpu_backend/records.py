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
    # A continuation: the index of the first prompt token that an earlier generation produced (the start
    # of the answer, X-Answer-Start). From there the prompt is evaluated one token a step, as generated
    # tokens were, and those tokens count for the penalties: a greedy answer continues exactly.
    answer_start: int | None = None
    # That answer's start as text: the tokens a slot generated it with are used where one still holds
    # them (continued.py), since the text's own tokens may be split otherwise.
    answer_text: str = ""
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
    cached_tokens: int = 0  # prompt tokens served from the prefix cache


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
