"""What a compliance check sends and how its answer is judged (pure functions).

A check is an ordinary chat request as the OpenAI API sends it (greedy: ``temperature=0``, a seed,
``max_tokens``), with a prompt from :data:`CHECK_PROMPTS`, so a worker cannot tell it from user work on
the wire. Its answer is compared token by token with a trusted worker's answer to the same job:

* the same backend build (model id, revision or file hash, and backend version all reported and equal):
  greedy decoding repeats exactly, so any differing token fails the check;
* otherwise (another engine build of the same model file, or another file or revision of the model
  config when no trusted worker shares it): greedy output drifts once a near-tie flips, so the answers
  may differ by an edit distance of at most ``tolerance`` times the longer answer's tokens, counted
  after their common prefix. Another model, or a much cheaper quantization, differs by far more.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

from oasst_inference_server.openai_protocol.generation_requests import ChatCompletionRequest
from oasst_shared.protocol import ChatTurn, Work

# Realistic prompts of the kind users send; answers are short and plain.
CHECK_PROMPTS = [
    "What is the capital of France?",
    "Give me three tips for staying focused while working from home.",
    "Explain in two sentences what photosynthesis is.",
    "Write a haiku about the sea.",
    "What is the difference between a list and a tuple in Python?",
    "How many legs does a spider have?",
    "Suggest a name for a small coffee shop.",
    "Why is the sky blue?",
    "Translate 'good morning' into Spanish and French.",
    "What are the main ingredients of a pancake?",
    "Summarize the plot of Romeo and Juliet in one paragraph.",
    "What does a compiler do?",
    "List four planets of the solar system.",
    "How do I boil an egg?",
    "What is the boiling point of water at sea level?",
    "Write a short thank-you note to a colleague.",
]


@dataclass(frozen=True)
class Identity:
    """What a worker reported about its backend (``WorkerInfo``)."""

    model_config_name: str
    model_id: str | None
    revision: str | None
    build: str | None

    def comparable(self, other: Identity) -> bool:
        """Whether answers of the two may be compared at all: one model config, one model and revision."""
        return (
            self.model_config_name == other.model_config_name
            and self.model_id == other.model_id
            and self.revision == other.revision
        )

    def same_build(self, other: Identity) -> bool:
        """Greedy output repeats exactly: every part reported, and equal."""
        return (
            self.comparable(other)
            and None not in (self.model_id, self.revision, self.build)
            and self.build == other.build
        )


@dataclass(frozen=True)
class ProbeOutcome:
    """A check job's answer: its token texts in order, or None when the check is inconclusive."""

    tokens: list[str] | None
    text: str
    claimed_tokens: int
    detail: str


class SpotChecks(Protocol):
    """Where a connection hands a finished greedy user job of an untrusted worker to be replayed on a
    trusted worker and compared after the fact (``compliance.ComplianceChecker``)."""

    def wants(self, work: Work) -> bool:
        """Whether to keep this job's tokens for a spot check (a draw of the configured fraction)."""
        ...

    def spot_check(self, connection: object, work: Work, tokens: list[str]) -> None: ...


@dataclass(frozen=True)
class Verdict:
    passed: bool
    detail: str


def check_work(message_id: str, model_config_name: str, prompt_index: int, max_new_tokens: int) -> Work:
    """The job of a check: the Work frame a ``/v1/chat/completions`` request at temperature 0 makes."""
    prompt = CHECK_PROMPTS[prompt_index % len(CHECK_PROMPTS)]
    seed = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "big")
    request = ChatCompletionRequest.model_validate(
        {
            "model": model_config_name,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0,
            "seed": seed,
            "max_tokens": max_new_tokens,
        }
    )
    return Work(
        message_id=message_id,
        chat_id=None,
        model_config_name=model_config_name,
        thread=[ChatTurn.model_validate({"role": "user", "content": prompt})],
        sampling_parameters=request.to_sampling_parameters(max_new_tokens),
    )


def edit_distance(a: list[str], b: list[str]) -> int:
    """Levenshtein distance between two token sequences."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def compare(expected: list[str], actual: list[str], *, same_build: bool, tolerance: float) -> Verdict:
    """Judge ``actual`` (the checked worker's tokens) against ``expected`` (the trusted worker's)."""
    prefix = 0
    for x, y in zip(expected, actual, strict=False):
        if x != y:
            break
        prefix += 1
    if prefix == len(expected) == len(actual):
        return Verdict(True, f"all {prefix} tokens match")
    where = f"first difference at token {prefix} of {len(expected)}"
    if same_build:
        return Verdict(False, f"{where} (same build: greedy output must match exactly)")
    rest_expected, rest_actual = expected[prefix:], actual[prefix:]
    distance = edit_distance(rest_expected, rest_actual)
    allowed = tolerance * max(len(expected), len(actual))
    verdict = f"{where}; edit distance {distance} tokens, {allowed:.1f} allowed between builds"
    return Verdict(distance <= allowed, verdict)
