"""The engine: one llama.cpp context, loaded once, generating one request at a time.

Everything here is synchronous and meant to run in the scheduler's single generation thread, except
tokenize/detokenize helpers, which only read the vocabulary and are safe from any thread.
"""

from __future__ import annotations

import codecs
import ctypes
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import Llama
from loguru import logger

from oasst_cpu_backend.grammar import sampler_grammar
from oasst_cpu_backend.records import EngineRequest, EngineResult, FinishReason, Step, Summary, TokenOut
from oasst_cpu_backend.stops import TokenHoldback

# llama.cpp treats this seed value as "pick a random seed".
_LLAMA_RANDOM_SEED = 0xFFFFFFFF

StepCallback = Callable[[Step], None]


@dataclass(frozen=True)
class _Held:
    id: int
    logprob: float
    special: bool
    top_tokens: list[TokenOut] | None


class ModelEngine:
    def __init__(
        self,
        model_path: Path,
        *,
        n_ctx: int,
        n_threads: int,
        n_batch: int = 512,
        prefill_chunk_tokens: int = 64,
        prefix_cache: bool = True,
    ) -> None:
        started = time.monotonic()
        logger.info("loading model {} (n_ctx={}, n_threads={})", model_path, n_ctx, n_threads)
        self._llm = Llama(
            model_path=str(model_path),
            n_ctx=n_ctx,
            n_threads=n_threads,
            n_threads_batch=n_threads,
            n_batch=n_batch,
            # Repetition penalty covers every generated token, as in TGI (llama.cpp's default is 64).
            last_n_tokens_size=n_ctx,
            verbose=False,
        )
        self.model_path = model_path
        self.n_ctx = self._llm.n_ctx()
        self.n_vocab = self._llm.n_vocab()
        self._vocab = llama_cpp.llama_model_get_vocab(self._llm.model)
        self._chunk = prefill_chunk_tokens
        self._prefix_cache = prefix_cache
        self.metadata: dict[str, str] = dict(self._llm.metadata)
        logger.info(
            "model loaded in {:.2f}s ({} tokens of vocabulary)", time.monotonic() - started, self.n_vocab
        )

    # ---- vocabulary (thread-safe: the vocabulary is read-only) ----

    @property
    def vocab(self) -> llama_cpp.llama_vocab_p:
        """The model's vocabulary, for checking grammars against it (grammar.py)."""
        return self._vocab

    def tokenize(self, text: str) -> list[int]:
        # Special tokens are parsed: prompts rendered from a chat template contain them as text.
        return self._llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)

    def is_special(self, token_id: int) -> bool:
        return bool(
            llama_cpp.llama_vocab_is_control(self._vocab, token_id)
            or llama_cpp.llama_vocab_is_eog(self._vocab, token_id)
        )

    def is_end_of_generation(self, token_id: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token_id))

    def token_bytes(self, token_id: int) -> bytes:
        return self._llm.detokenize([token_id], special=self.is_special(token_id))

    def token_text(self, token_id: int) -> str:
        return self.token_bytes(token_id).decode("utf-8", errors="replace")

    def special_token_text(self, metadata_key: str) -> str | None:
        raw = self.metadata.get(metadata_key)
        if raw is None:
            return None
        try:
            token_id = int(raw)
        except ValueError:
            return None
        if not 0 <= token_id < self.n_vocab:
            return None
        return self.token_text(token_id)

    def close(self) -> None:
        self._llm.close()

    # ---- generation (one at a time, in the generation thread) ----

    def generate(
        self,
        job: EngineRequest,
        is_cancelled: Callable[[], bool],
        on_step: StepCallback | None = None,
    ) -> EngineResult:
        result = EngineResult(status="finished", prompt_tokens=len(job.prompt_tokens))
        result.started_at = time.monotonic()
        if result.started_at > min(job.queue_deadline, job.deadline):
            result.status = "queue_timeout"
            result.finished_at = time.monotonic()
            return result
        try:
            reused = self._prefill(job, is_cancelled)
        except BaseException:
            # A failed decode leaves the KV cache in an unknown state; start from scratch next time.
            self._llm.reset()
            raise
        if reused is None:
            result.status = "cancelled" if is_cancelled() else "timeout"
            result.finished_at = time.monotonic()
            return result
        result.reused_prompt_tokens = reused
        try:
            self._decode(job, is_cancelled, on_step, result)
        except BaseException:
            self._llm.reset()
            raise
        result.finished_at = time.monotonic()
        return result

    def _prefill(self, job: EngineRequest, is_cancelled: Callable[[], bool]) -> int | None:
        """Evaluate the prompt in chunks; return how many cached tokens were reused, None if stopped."""
        llm = self._llm
        tokens = job.prompt_tokens
        keep = 0
        if self._prefix_cache and llm.n_tokens > 0:
            cached = llm.input_ids[: llm.n_tokens]
            common = 0
            for a, b in zip(cached, tokens, strict=False):
                if a != b:
                    break
                common += 1
            # At least one token is evaluated so that fresh logits exist. Chunk boundaries stay at
            # multiples of the chunk size, so a prompt is always evaluated in the same batches whatever
            # was cached: greedy output then does not depend on the previous request.
            keep = (min(common, len(tokens) - 1) // self._chunk) * self._chunk
        if keep == 0:
            llm.reset()
        else:
            # eval() drops the KV cache from n_tokens on before it decodes.
            llm.n_tokens = keep
        for begin in range(keep, len(tokens), self._chunk):
            if is_cancelled() or time.monotonic() > job.deadline:
                return None
            llm.eval(tokens[begin : begin + self._chunk])
        return keep

    def _decode(
        self,
        job: EngineRequest,
        is_cancelled: Callable[[], bool],
        on_step: StepCallback | None,
        result: EngineResult,
    ) -> None:
        llm = self._llm
        sampling = job.sampling
        seed: int | None = None
        if not sampling.greedy:
            seed = (
                sampling.seed
                if sampling.seed is not None
                else int(np.random.default_rng().integers(2**32 - 1))
            )
            # llama.cpp takes a 32-bit seed and reads 0xFFFFFFFF as "random": fold larger seeds into the
            # range it treats as fixed, so every seed reproduces.
            llm.set_seed(seed % _LLAMA_RANDOM_SEED)
        grammar = sampler_grammar(self._vocab, sampling.grammar) if sampling.grammar else None
        holdback: TokenHoldback[_Held] = TokenHoldback(job.stop)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # The prompt is already evaluated, so generate() finds it cached and samples at once.
        generator = llm.generate(
            job.prompt_tokens,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            min_p=0.0,
            typical_p=sampling.typical_p,
            temp=sampling.temperature,
            repeat_penalty=sampling.repetition_penalty,
            frequency_penalty=sampling.frequency_penalty,
            presence_penalty=0.0,
            grammar=grammar,
        )
        count = 0
        try:
            for token_id in generator:
                count += 1
                if result.first_token_at is None:
                    result.first_token_at = time.monotonic()
                logprobs = self._last_logprobs()
                held = _Held(
                    id=token_id,
                    logprob=float(logprobs[token_id]),
                    special=self.is_special(token_id),
                    top_tokens=self._top_tokens(logprobs, job.top_n_tokens) if job.top_n_tokens else None,
                )
                finish: FinishReason | None = None
                if self.is_end_of_generation(token_id):
                    released = holdback.finish()
                    released.append((held, self.token_text(token_id)))
                    finish = "eos_token"
                elif held.special:
                    released = holdback.push(held, self.token_text(token_id), is_text=False)
                else:
                    released = holdback.push(held, decoder.decode(self.token_bytes(token_id)))
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
                        seed=seed,
                    )
                    if finish is not None
                    else None
                )
                for position, (item, text) in enumerate(released):
                    last = position == len(released) - 1
                    step = Step(
                        token=TokenOut(id=item.id, text=text, logprob=item.logprob, special=item.special),
                        top_tokens=item.top_tokens,
                        summary=summary if last else None,
                    )
                    result.steps.append(step)
                    if on_step is not None:
                        on_step(step)
                result.generated_tokens = count
                if summary is not None:
                    result.summary = summary
                    return
                # Checked before the generator resumes, i.e. before the next token is computed.
                if is_cancelled():
                    result.status = "cancelled"
                    return
                if time.monotonic() > job.deadline:
                    result.status = "timeout"
                    return
        finally:
            generator.close()

    def _last_logprobs(self) -> np.ndarray[Any, np.dtype[np.float32]]:
        pointer = llama_cpp.llama_get_logits_ith(self._llm.ctx, -1)
        logits = np.ctypeslib.as_array(
            ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,)
        )
        peak = float(logits.max())
        log_total = peak + float(np.log(np.exp(logits - peak).sum()))
        return (logits - log_total).astype(np.float32)

    def _top_tokens(self, logprobs: np.ndarray[Any, np.dtype[np.float32]], n: int) -> list[TokenOut]:
        n = min(n, self.n_vocab)
        best = np.argpartition(-logprobs, n - 1)[:n]
        best = best[np.argsort(-logprobs[best])]
        return [
            TokenOut(
                id=int(token_id),
                text=self.token_text(int(token_id)),
                logprob=float(logprobs[token_id]),
                special=self.is_special(int(token_id)),
            )
            for token_id in best
        ]

    def prompt_token_texts(self, tokens: Sequence[int]) -> list[str]:
        return [self.token_text(token_id) for token_id in tokens]
