"""Checks of generation parameters, with TGI's rules and wording, and their translation to llama.cpp
(a request's grammar: grammar.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from oasst_cpu_backend.records import EngineRequest, Sampling
from oasst_cpu_backend.refusals import InvalidRequest as InvalidRequest  # re-exported
from oasst_cpu_backend.schemas import GenerateParameters


@dataclass(frozen=True)
class Limits:
    n_ctx: int
    max_input_length: int
    max_stop_sequences: int
    max_top_n_tokens: int


def _check_finite(name: str, value: float | None) -> None:
    if value is not None and not math.isfinite(value):
        raise InvalidRequest(f"`{name}` must be a finite number")


def check_parameters(params: GenerateParameters, limits: Limits, *, stream: bool) -> None:
    """Range checks that need no tokenization."""
    for name in ("temperature", "top_p", "typical_p", "repetition_penalty", "frequency_penalty"):
        _check_finite(name, getattr(params, name))
    if params.best_of is not None and params.best_of != 1:
        if params.best_of <= 0:
            raise InvalidRequest("`best_of` must be strictly positive")
        raise InvalidRequest(f"`best_of` must be <= 1. Given: {params.best_of}")
    if params.temperature is not None and params.temperature <= 0:
        raise InvalidRequest("`temperature` must be strictly positive")
    if params.repetition_penalty is not None and params.repetition_penalty <= 0:
        raise InvalidRequest("`repetition_penalty` must be strictly positive")
    if params.frequency_penalty is not None and not -2.0 <= params.frequency_penalty <= 2.0:
        raise InvalidRequest("`frequency_penalty` must be >= -2.0 and <= 2.0")
    if params.top_p is not None and not 0.0 < params.top_p <= 1.0:
        raise InvalidRequest("`top_p` must be > 0.0 and <= 1.0")
    if params.typical_p is not None and not 0.0 < params.typical_p <= 1.0:
        raise InvalidRequest("`typical_p` must be > 0.0 and <= 1.0")
    if params.top_k is not None and params.top_k <= 0:
        raise InvalidRequest("`top_k` must be strictly positive")
    if params.max_new_tokens is not None and params.max_new_tokens <= 0:
        raise InvalidRequest("`max_new_tokens` must be strictly positive")
    if params.seed is not None and not 0 <= params.seed < 2**64:
        raise InvalidRequest("`seed` must be >= 0 and < 2^64")
    if params.truncate is not None and not 0 < params.truncate <= limits.max_input_length:
        raise InvalidRequest(
            f"`truncate` must be strictly positive and less than or equal to {limits.max_input_length}. "
            f"Given: {params.truncate}"
        )
    if params.top_n_tokens is not None and not 0 <= params.top_n_tokens <= limits.max_top_n_tokens:
        raise InvalidRequest(
            f"`top_n_tokens` must be >= 0 and <= {limits.max_top_n_tokens}. Given: {params.top_n_tokens}"
        )
    if len(params.stop) > limits.max_stop_sequences:
        raise InvalidRequest(
            f"`stop` supports up to {limits.max_stop_sequences} stop sequences. Given: {len(params.stop)}"
        )
    if any(not stop for stop in params.stop):
        raise InvalidRequest("`stop` sequences must not be empty")
    if stream and params.decoder_input_details:
        raise InvalidRequest("`decoder_input_details` == true is not supported when streaming tokens")


def to_sampling(params: GenerateParameters, gbnf: str | None) -> Sampling:
    """TGI samples when do_sample is set or any warper departs from its neutral value; otherwise greedy."""
    temperature = params.temperature if params.temperature is not None else 1.0
    top_k = params.top_k or 0
    top_p = params.top_p if params.top_p is not None else 1.0
    typical_p = params.typical_p if params.typical_p is not None else 1.0
    has_warpers = temperature != 1.0 or top_k != 0 or top_p < 1.0 or typical_p < 1.0
    sampling = params.do_sample or has_warpers
    return Sampling(
        temperature=temperature if sampling else 0.0,
        top_k=top_k,
        top_p=top_p,
        typical_p=typical_p,
        repetition_penalty=params.repetition_penalty if params.repetition_penalty is not None else 1.0,
        frequency_penalty=params.frequency_penalty or 0.0,
        seed=params.seed,
        grammar=gbnf,
    )


def build_request(
    params: GenerateParameters,
    prompt_tokens: list[int],
    limits: Limits,
    *,
    gbnf: str | None,
    enqueued_at: float,
    queue_deadline: float,
    deadline: float,
    answer_start: int | None = None,
    answer_text: str = "",
) -> EngineRequest:
    """Truncate the prompt and check it fits the context together with max_new_tokens. ``answer_start``:
    the index of the first token of a continued answer's start in ``prompt_tokens``."""
    if params.truncate is not None and params.truncate < len(prompt_tokens):
        # TGI keeps the end of the input: the newest text matters most.
        if answer_start is not None:
            answer_start = max(0, answer_start - (len(prompt_tokens) - params.truncate))
        prompt_tokens = prompt_tokens[-params.truncate :]
    input_length = len(prompt_tokens)
    if input_length == 0:
        raise InvalidRequest("`inputs` cannot be empty")
    if input_length > limits.max_input_length:
        raise InvalidRequest(
            f"`inputs` must have less than {limits.max_input_length + 1} tokens. Given: {input_length}"
        )
    max_new_tokens = (
        params.max_new_tokens if params.max_new_tokens is not None else limits.n_ctx - input_length
    )
    if input_length + max_new_tokens > limits.n_ctx:
        raise InvalidRequest(
            f"`inputs` tokens + `max_new_tokens` must be <= {limits.n_ctx}. "
            f"Given: {input_length} `inputs` tokens and {max_new_tokens} `max_new_tokens`"
        )
    return EngineRequest(
        prompt_tokens=prompt_tokens,
        max_new_tokens=max_new_tokens,
        sampling=to_sampling(params, gbnf),
        stop=list(params.stop),
        top_n_tokens=params.top_n_tokens or 0,
        answer_start=answer_start if answer_start is not None and answer_start < input_length else None,
        answer_text=answer_text if answer_start is not None else "",
        enqueued_at=enqueued_at,
        queue_deadline=queue_deadline,
        deadline=deadline,
    )
