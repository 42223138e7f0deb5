"""Continuous batching: the sequences being decoded, one llama.cpp batch per step.

Each step first ends the sequences that were cancelled or ran past their deadline (before their next
token is computed), then decodes one batch: the last sampled token of every generating sequence plus at
most one prompt chunk of the sequences still prefilling (oldest first), so that a joining request's
prompt delays the others by one chunk per step, never by its whole prompt. Each output is sampled with
its sequence's own sampler chain. Requests join (:meth:`BatchRunner.start`) and leave between steps.
Everything here runs in one thread: the scheduler's generation thread.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from loguru import logger

from oasst_cpu_backend.continued import as_generated
from oasst_cpu_backend.engine import BatchEntry, ModelEngine
from oasst_cpu_backend.records import EngineRequest, EngineResult
from oasst_cpu_backend.sequence import ActiveSequence, StepCallback
from oasst_cpu_backend.slots import SlotTable


class BatchRunner:
    def __init__(self, engine: ModelEngine) -> None:
        self.engine = engine
        self.slots = SlotTable(
            engine.parallel_sequences,
            engine.n_ctx,
            chunk=engine.prefill_chunk,
            prefix_cache=engine.prefix_cache,
        )
        self.active: list[ActiveSequence] = []  # in order of arrival

    @property
    def has_room(self) -> bool:
        return self.slots.free > 0

    def start(
        self,
        job: EngineRequest,
        *,
        is_cancelled: Callable[[], bool],
        on_step: StepCallback | None,
        on_done: Callable[[EngineResult | BaseException], None],
    ) -> ActiveSequence:
        """Give ``job`` a free slot (reusing its longest cached prefix); raises InvalidRequest for a grammar
        llama.cpp refuses. Only while :attr:`has_room`."""
        if job.answer_start is not None:
            # A continued answer: its start as the tokens it was generated with, where a slot holds them.
            job = as_generated(job, self.slots.slots, self.engine.token_bytes, self.slots.capacity)
        acquired = self.slots.acquire(job.prompt_tokens)
        if acquired is None:
            raise RuntimeError("no free slot")
        slot, keep = acquired
        self.engine.keep_prefix(slot.seq_id, keep)
        sampling = job.sampling
        seed = None
        if not sampling.greedy:
            seed = (
                sampling.seed
                if sampling.seed is not None
                else int(np.random.default_rng().integers(2**32 - 1))
            )
        try:
            sequence = ActiveSequence(
                self.engine,
                job,
                slot,
                keep,
                seed=seed,
                is_cancelled=is_cancelled,
                on_step=on_step,
                on_done=on_done,
            )
        except BaseException:
            self.slots.release(slot)
            raise
        self.active.append(sequence)
        return sequence

    def step(self) -> None:
        for sequence in list(self.active):
            reason = sequence.stopped_reason()
            if reason is not None:
                sequence.finish(reason)
                self._leave(sequence)
        if not self.active:
            return
        chunk = self.engine.prefill_chunk
        chosen = [s for s in self.active if not s.prefilling]
        budget = chunk
        prefilling = False
        for sequence in self.active:
            if sequence.prefilling:
                size = len(sequence.next_tokens(chunk))
                if prefilling and size > budget:
                    break
                chosen.append(sequence)
                prefilling = True
                budget -= size
                if budget <= 0:
                    break
        # Sequence ids in increasing order: llama.cpp puts consecutive ids in one micro-batch.
        chosen.sort(key=lambda s: s.slot.seq_id)
        inputs = [s.next_tokens(chunk) for s in chosen]
        entries = [
            BatchEntry(
                seq_id=s.slot.seq_id,
                start=len(s.slot.tokens),
                tokens=tokens,
                logits=not s.prefilling or s.prefilled + len(tokens) == len(s.job.prompt_tokens),
            )
            for s, tokens in zip(chosen, inputs, strict=True)
        ]
        try:
            outputs = self.engine.decode(entries)
        except Exception as error:
            logger.error("a batch of {} sequences failed: {}", len(chosen), error)
            for sequence in chosen:
                self.slots.forget(sequence.slot)
                self.engine.keep_prefix(sequence.slot.seq_id, 0)
                sequence.fail(error)
                self._leave(sequence)
            return
        for sequence, tokens, output in zip(chosen, inputs, outputs, strict=True):
            sequence.decoded(tokens)
            if output is None:
                continue
            try:
                token = sequence.sampler.sample(self.engine.ctx, output)
                sequence.accept(token, self.engine.logprobs(output))
            except Exception as error:  # e.g. an exception raised by a streaming callback
                sequence.fail(error)
            if sequence.done:
                self._leave(sequence)

    def _leave(self, sequence: ActiveSequence) -> None:
        if sequence in self.active:
            self.active.remove(sequence)
            self.slots.release(sequence.slot)

    def end_all(self, error: BaseException) -> None:
        for sequence in list(self.active):
            sequence.fail(error)
            self._leave(sequence)


def generate_alone(
    engine: ModelEngine,
    job: EngineRequest,
    is_cancelled: Callable[[], bool] = lambda: False,
    on_step: StepCallback | None = None,
) -> EngineResult:
    """Run one request to its end in a runner of its own (tests and tools; the server uses the scheduler)."""
    runner = BatchRunner(engine)
    outcome: list[EngineResult | BaseException] = []
    runner.start(job, is_cancelled=is_cancelled, on_step=on_step, on_done=outcome.append)
    while not outcome:
        runner.step()
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]
