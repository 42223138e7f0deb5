"""One request being decoded in the batch: its slot, sampler, stop-sequence holdback and result.

The batch loop (batch.py) feeds it: :meth:`next_tokens` says what the sequence puts in the next batch
(a chunk of its prompt, or the token it sampled last), :meth:`accept` takes the token sampled from its
output and turns it into streamed steps.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from oasst_cpu_backend.records import (
    EngineRequest,
    EngineResult,
    FinishReason,
    Status,
    Step,
    Summary,
    TokenOut,
)
from oasst_cpu_backend.sampling_chain import SamplerChain
from oasst_cpu_backend.slots import Slot
from oasst_cpu_backend.stops import TokenHoldback

if TYPE_CHECKING:
    from oasst_cpu_backend.engine import Logprobs, ModelEngine

StepCallback = Callable[[Step], None]


@dataclass(frozen=True)
class _Held:
    id: int
    logprob: float
    special: bool
    top_tokens: list[TokenOut] | None


class ActiveSequence:
    def __init__(
        self,
        engine: ModelEngine,
        job: EngineRequest,
        slot: Slot,
        reused: int,
        *,
        seed: int | None,
        is_cancelled: Callable[[], bool],
        on_step: StepCallback | None,
        on_done: Callable[[EngineResult | BaseException], None],
    ) -> None:
        self.engine = engine
        self.job = job
        self.slot = slot
        self.seed = seed
        self.is_cancelled = is_cancelled
        self.on_step = on_step
        self.on_done = on_done
        self.sampler = SamplerChain(
            engine.vocab, job.sampling, seed=seed, n_vocab=engine.n_vocab, penalty_last_n=engine.n_ctx
        )
        if job.answer_start is not None:
            for token_id in job.prompt_tokens[job.answer_start :]:
                self.sampler.accept(token_id)  # generated before: the penalties count them
        self.result = EngineResult(
            status="finished",
            prompt_tokens=len(job.prompt_tokens),
            reused_prompt_tokens=reused,
            started_at=time.monotonic(),
        )
        self.prefilled = reused  # prompt tokens in the slot's KV
        self.pending: int | None = None  # sampled, not yet decoded
        self.done = False
        self._holdback: TokenHoldback[_Held] = TokenHoldback(job.stop)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.job.prompt_tokens)

    def next_tokens(self, chunk: int) -> list[int]:
        """What this sequence adds to the next batch: the rest of its current prompt chunk (chunks end at
        multiples of ``chunk`` and at a continued answer's start), a token of that answer's start (one a
        step, as it was generated: the same numbers, so a greedy answer goes on as it would have), or
        the token it sampled last."""
        if self.prefilling:
            answer_start = self.job.answer_start
            if answer_start is not None and self.prefilled >= answer_start:
                return [self.job.prompt_tokens[self.prefilled]]
            end = min(len(self.job.prompt_tokens), (self.prefilled // chunk + 1) * chunk)
            if answer_start is not None:
                end = min(end, answer_start)
            return self.job.prompt_tokens[self.prefilled : end]
        assert self.pending is not None
        return [self.pending]

    def decoded(self, tokens: list[int]) -> None:
        """``tokens`` (from :meth:`next_tokens`) are now in the slot's KV."""
        self.slot.tokens.extend(tokens)
        if self.prefilling:
            self.prefilled += len(tokens)
        else:
            self.pending = None

    def stopped_reason(self) -> Status | None:
        """Checked before each step, i.e. before the next token is computed."""
        if self.is_cancelled():
            return "cancelled"
        if time.monotonic() > self.job.deadline:
            return "timeout"
        return None

    def accept(self, token_id: int, logprobs: Logprobs) -> None:
        """The token sampled from this sequence's output: stream what the holdback releases."""
        engine, job, result = self.engine, self.job, self.result
        result.generated_tokens += 1
        count = result.generated_tokens
        if result.first_token_at is None:
            result.first_token_at = time.monotonic()
        held = _Held(
            id=token_id,
            logprob=float(logprobs[token_id]),
            special=engine.is_special(token_id),
            top_tokens=engine.top_tokens(logprobs, job.top_n_tokens) if job.top_n_tokens else None,
        )
        holdback = self._holdback
        finish: FinishReason | None = None
        if engine.is_end_of_generation(token_id):
            released = holdback.finish()
            released.append((held, engine.token_text(token_id)))
            finish = "eos_token"
        elif held.special:
            released = holdback.push(held, engine.token_text(token_id), is_text=False)
        else:
            released = holdback.push(held, self._decoder.decode(engine.token_bytes(token_id)))
            if holdback.stopped:
                finish = "stop_sequence"
        if finish is None and count >= job.max_new_tokens:
            released += holdback.finish()
            finish = "length"
        summary = (
            Summary(
                finish_reason=finish,
                generated_tokens=count,
                generated_text=holdback.text,
                seed=self.seed,
                cached_tokens=result.reused_prompt_tokens,
            )
            if finish is not None
            else None
        )
        for position, (item, text) in enumerate(released):
            step = Step(
                token=TokenOut(id=item.id, text=text, logprob=item.logprob, special=item.special),
                top_tokens=item.top_tokens,
                summary=summary if position == len(released) - 1 else None,
            )
            result.steps.append(step)
            if self.on_step is not None:
                self.on_step(step)
        if summary is not None:
            result.summary = summary
            self.finish("finished")
        else:
            self.pending = token_id

    def finish(self, status: Status) -> None:
        if self.done:
            return
        self.done = True
        self.result.status = status
        self.result.finished_at = time.monotonic()
        self.sampler.free()
        self.on_done(self.result)

    def fail(self, error: BaseException) -> None:
        """The batch this sequence was in failed: the request ends with ``error``."""
        if not self.done:
            self.done = True
            self.sampler.free()
            self.on_done(error)
