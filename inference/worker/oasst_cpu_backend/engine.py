"""The engine: the model's vocabulary and one llama.cpp context that decodes several sequences per step.

The context has ``parallel_sequences`` sequence ids, each with a KV stream of its own of ``n_ctx``
tokens (the KV budget divided among them). :meth:`ModelEngine.decode` evaluates one batch (prompt chunks
and sampled tokens of several sequences) through llama.cpp's batch API; batch.py decides what goes in it.
Decoding runs only in the scheduler's generation thread; the vocabulary helpers only read the vocabulary
and are safe from any thread.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import Llama
from loguru import logger

from oasst_cpu_backend.records import TokenOut

Logprobs = np.ndarray[Any, np.dtype[np.float32]]

# The Llama object only serves the vocabulary and metadata: its own context is kept tiny.
_VOCABULARY_CONTEXT = 64


@dataclass(frozen=True)
class BatchEntry:
    """Tokens of one sequence for the next batch, at positions start..start+len-1."""

    seq_id: int
    start: int
    tokens: Sequence[int]
    logits: bool  # whether the last token's logits are wanted (to sample from)


class DecodeError(RuntimeError):
    pass


class ModelEngine:
    def __init__(
        self,
        model_path: Path,
        *,
        n_ctx: int,
        n_threads: int,
        n_threads_batch: int | None = None,
        n_batch: int = 512,
        prefill_chunk_tokens: int = 64,
        prefix_cache: bool = True,
        parallel_sequences: int = 1,
        kv_budget_tokens: int | None = None,
    ) -> None:
        started = time.monotonic()
        per_sequence = (
            n_ctx if kv_budget_tokens is None else min(n_ctx, kv_budget_tokens // parallel_sequences)
        )
        if per_sequence < 16:
            raise ValueError(
                f"a KV budget of {kv_budget_tokens} tokens leaves {per_sequence} per sequence "
                f"for {parallel_sequences} sequences: at least 16 are needed"
            )
        logger.info(
            "loading model {} ({} sequences x {} tokens of context, n_threads={}, n_threads_batch={})",
            model_path,
            parallel_sequences,
            per_sequence,
            n_threads,
            n_threads_batch or n_threads,
        )
        self._llm = Llama(
            model_path=str(model_path), n_ctx=_VOCABULARY_CONTEXT, n_threads=n_threads, verbose=False
        )
        self.model_path = model_path
        self.n_vocab = self._llm.n_vocab()
        self._vocab = llama_cpp.llama_model_get_vocab(self._llm.model)
        self.parallel_sequences = parallel_sequences
        self.prefill_chunk = prefill_chunk_tokens
        self.prefix_cache = prefix_cache
        # A batch holds at most one token per generating sequence plus one prompt chunk.
        self.batch_tokens = max(n_batch, prefill_chunk_tokens + parallel_sequences)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = per_sequence * parallel_sequences
        params.n_batch = params.n_ubatch = self.batch_tokens
        params.n_seq_max = parallel_sequences
        # llama.cpp uses n_threads for a batch of one token (one sequence generating) and n_threads_batch
        # for larger ones (several sequences generating, prompt chunks).
        params.n_threads = n_threads
        params.n_threads_batch = n_threads_batch or n_threads
        # A KV stream per sequence: a sequence's attention never sees the others' cells, so its numbers
        # (and a greedy answer) are the same whether it runs alone or beside others.
        params.kv_unified = False
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        params.no_perf = True
        ctx = llama_cpp.llama_init_from_model(self._llm.model, params)
        if not ctx:
            self._llm.close()
            raise RuntimeError(f"llama.cpp could not create a context of {params.n_ctx} tokens")
        self._ctx: llama_cpp.llama_context_p | None = ctx
        self._memory = llama_cpp.llama_get_memory(ctx)
        self.n_ctx = int(llama_cpp.llama_n_ctx_seq(ctx))
        self.kv_budget_tokens = self.n_ctx * parallel_sequences
        self._batch = llama_cpp.llama_batch_init(self.batch_tokens, 0, 1)
        self.metadata: dict[str, str] = dict(self._llm.metadata)
        logger.info(
            "model loaded in {:.2f}s ({} tokens of vocabulary, KV budget {} tokens)",
            time.monotonic() - started,
            self.n_vocab,
            self.kv_budget_tokens,
        )

    # ---- vocabulary (thread-safe: the vocabulary is read-only) ----

    @property
    def vocab(self) -> llama_cpp.llama_vocab_p:
        """The model's vocabulary, for checking grammars against it (grammar.py)."""
        return self._vocab

    @property
    def ctx(self) -> llama_cpp.llama_context_p:
        assert self._ctx is not None
        return self._ctx

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

    def detokenize(self, token_ids: list[int]) -> str:
        """The text of ``token_ids``, special tokens written out (as tokenize parses them); every id
        must be in the vocabulary (llama.cpp does not check)."""
        return self._llm.detokenize(token_ids, special=True).decode("utf-8", errors="replace")

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

    def prompt_token_texts(self, tokens: Sequence[int]) -> list[str]:
        return [self.token_text(token_id) for token_id in tokens]

    def close(self) -> None:
        if self._ctx is not None:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        self._llm.close()

    # ---- decoding (in the generation thread) ----

    def keep_prefix(self, seq_id: int, keep: int) -> None:
        """Drop sequence ``seq_id``'s KV from position ``keep`` on (0: all of it)."""
        llama_cpp.llama_memory_seq_rm(self._memory, seq_id, keep if keep > 0 else -1, -1)

    def decode(self, entries: Sequence[BatchEntry]) -> list[int | None]:
        """Evaluate one batch; for each entry, the output index of its last token's logits (or None)."""
        batch = self._batch
        n = 0
        outputs: list[int | None] = []
        for entry in entries:
            for offset, token in enumerate(entry.tokens):
                batch.token[n] = token
                batch.pos[n] = entry.start + offset
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = entry.seq_id
                batch.logits[n] = False
                n += 1
            if entry.logits:
                batch.logits[n - 1] = True
                outputs.append(n - 1)
            else:
                outputs.append(None)
        if n > self.batch_tokens:
            raise DecodeError(f"a batch of {n} tokens exceeds the batch size {self.batch_tokens}")
        batch.n_tokens = n
        code = llama_cpp.llama_decode(self.ctx, batch)
        if code != 0:
            raise DecodeError(f"llama_decode failed with code {code}")
        return outputs

    def logprobs(self, output_index: int) -> Logprobs:
        pointer = llama_cpp.llama_get_logits_ith(self.ctx, output_index)
        logits = np.ctypeslib.as_array(
            ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,)
        )
        peak = float(logits.max())
        log_total = peak + float(np.log(np.exp(logits - peak).sum()))
        return (logits - log_total).astype(np.float32)

    def top_tokens(self, logprobs: Logprobs, n: int) -> list[TokenOut]:
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
