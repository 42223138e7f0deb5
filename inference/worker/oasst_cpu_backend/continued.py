"""A continued answer's start as the tokens it was generated with.

A continuation request (``X-Answer-Start``) sends the start of an answer as text, and the text's own
tokens are not always those the model generated it with (a greedy answer may say " Val" + "oric" where
the tokenizer splits " Valor" + "ic"); other tokens mean other numbers, and the greedy answer may turn.
Where a slot still holds the answer (the same backend generated it: its worker was lost, the backend
lives), the tokens it generated are used instead; elsewhere the text's own tokens are the best guess.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from oasst_cpu_backend.records import EngineRequest
from oasst_cpu_backend.slots import Slot


def as_generated(
    job: EngineRequest, slots: Sequence[Slot], token_bytes: Callable[[int], bytes], capacity: int
) -> EngineRequest:
    """``job`` with the tokens of its answer's start replaced by those a slot generated them with, if a
    slot holds the same prompt followed by tokens that spell exactly that text (and the job still fits
    ``capacity``, the context of a slot); else ``job`` as it is."""
    start = job.answer_start
    if start is None or not job.answer_text:
        return job
    head = job.prompt_tokens[:start]
    wanted = job.answer_text.encode("utf-8")
    for slot in slots:
        held = list(slot.tokens)  # a copy: the slot may be generating (this runs in its thread, though)
        if len(held) <= start or held[:start] != head:
            continue
        generated = _spelling(held[start:], wanted, token_bytes)
        if generated is None:
            continue
        if len(head) + len(generated) + job.max_new_tokens > capacity:
            return job
        return replace(job, prompt_tokens=head + generated)
    return job


def _spelling(tokens: Sequence[int], wanted: bytes, token_bytes: Callable[[int], bytes]) -> list[int] | None:
    """The first tokens of ``tokens`` whose bytes are exactly ``wanted``; None if none are."""
    spelled = bytearray()
    for count, token in enumerate(tokens, 1):
        spelled += token_bytes(token)
        if len(spelled) >= len(wanted):
            return list(tokens[:count]) if spelled == wanted else None
        if not wanted.startswith(spelled):
            return None
    return None
