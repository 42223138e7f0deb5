"""One llama.cpp sampler chain per sequence: its penalties, grammar and warpers, as llama-cpp-python's
``Llama.generate`` builds them (so a request samples as it did before batching), owned by the sequence
and freed with it."""

from __future__ import annotations

import llama_cpp

from oasst_cpu_backend.records import Sampling
from oasst_cpu_backend.refusals import InvalidRequest

# llama.cpp treats this seed value as "pick a random seed".
LLAMA_RANDOM_SEED = 0xFFFFFFFF
_ROOT = b"root"


class SamplerChain:
    def __init__(
        self,
        vocab: llama_cpp.llama_vocab_p,
        sampling: Sampling,
        *,
        seed: int | None,
        n_vocab: int,
        penalty_last_n: int,
    ) -> None:
        params = llama_cpp.llama_sampler_chain_default_params()
        params.no_perf = True
        self._chain: llama_cpp.llama_sampler_p | None = llama_cpp.llama_sampler_chain_init(params)
        try:
            # Penalties cover the generated tokens only (the prompt is never accepted), as before.
            self._add(
                llama_cpp.llama_sampler_init_penalties(
                    n_vocab, penalty_last_n, sampling.repetition_penalty, sampling.frequency_penalty, 0.0
                )
            )
            if sampling.grammar is not None:
                grammar = llama_cpp.llama_sampler_init_grammar(vocab, sampling.grammar.encode("utf-8"), _ROOT)
                if not grammar:
                    # A NULL sampler in a chain kills the process at the first token (grammar.py).
                    raise InvalidRequest("`grammar`: llama.cpp refused the grammar built from the schema")
                self._add(grammar)
            if sampling.greedy or seed is None:
                self._add(llama_cpp.llama_sampler_init_greedy())
            else:
                self._add(llama_cpp.llama_sampler_init_top_k(sampling.top_k))
                self._add(llama_cpp.llama_sampler_init_typical(sampling.typical_p, 1))
                self._add(llama_cpp.llama_sampler_init_top_p(sampling.top_p, 1))
                self._add(llama_cpp.llama_sampler_init_min_p(0.0, 1))
                self._add(llama_cpp.llama_sampler_init_temp(sampling.temperature))
                # llama.cpp takes a 32-bit seed and reads 0xFFFFFFFF as "random": larger seeds are folded
                # into the range it treats as fixed, so every seed reproduces.
                self._add(llama_cpp.llama_sampler_init_dist(seed % LLAMA_RANDOM_SEED))
        except BaseException:
            self.free()
            raise

    def _add(self, sampler: llama_cpp.llama_sampler_p) -> None:
        llama_cpp.llama_sampler_chain_add(self._chain, sampler)

    def sample(self, ctx: llama_cpp.llama_context_p, output_index: int) -> int:
        """Sample (and accept) the next token from the batch's output at ``output_index``."""
        assert self._chain is not None
        return int(llama_cpp.llama_sampler_sample(self._chain, ctx, output_index))

    def accept(self, token_id: int) -> None:
        """Count ``token_id`` as generated (a continued answer's start): penalties and grammar see it."""
        assert self._chain is not None
        llama_cpp.llama_sampler_accept(self._chain, token_id)

    def free(self) -> None:
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
