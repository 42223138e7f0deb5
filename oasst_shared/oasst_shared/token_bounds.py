"""An upper bound on a text's tokens that needs no tokenizer, shared by the worker and the server.

No tokenizer makes more tokens of a text than :func:`token_bound`: a byte-level BPE or byte-fallback
token holds at least one byte, and a tokenizer may add a few of its own (BOS/EOS, a SentencePiece
dummy-prefix piece). A prompt whose bound fits a model's input limit fits, whatever the model; only a
prompt above it needs counting by the model's tokenizer.
"""

from __future__ import annotations

# Tokens a tokenizer may add beyond one per byte of text: BOS/EOS, a SentencePiece dummy-prefix piece.
ADDED_TOKENS = 8


def utf8_bytes(text: str) -> int:
    """Bytes of ``text`` in UTF-8 (without encoding it when it is ASCII: a flag CPython keeps)."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def token_bound(text: str) -> int:
    """At least as many tokens as any tokenizer makes of ``text``."""
    return utf8_bytes(text) + ADDED_TOKENS
