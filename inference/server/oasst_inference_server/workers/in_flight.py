"""The messages a worker connection holds: one record per message, created when its claim is made (before
its frame is sent) and removed in one place (:meth:`InFlightMessages.remove`), whatever ends it.

A compliance check's job is not one of them: it is never stored as a message (:mod:`.compliance_hooks`).
What the claim gate holds back until a claim is committed is the gate's (:mod:`.claim_gate`).
"""

from __future__ import annotations

import time
from collections.abc import KeysView
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from oasst_inference_server.scheduling.fair_share import CHARS_PER_TOKEN
from oasst_inference_server.workers.embedding_parts import EmbeddingAssembly
from oasst_inference_server.workers.worker_frames import token_cap
from oasst_shared.protocol import EmbedWork, Work


@dataclass
class InFlight:
    """One message a worker holds, from its claim to its end."""

    message_id: str
    # The generation job sent (its bounds cap the tokens and usage the worker may claim); None for embeddings.
    work: Work | None
    # An embedding job's vectors received so far, of a result sent in parts (protocol 4).
    embeddings: EmbeddingAssembly | None
    dispatched_at: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    # Bytes of text streamed (to bound the usage the worker claims).
    streamed_bytes: int = 0
    # Token frames taken, bounded by worker_frames.token_cap (the rest are dropped).
    token_frames: int = 0
    # A user job drawn for a spot check: its streamed token texts, compared after the fact.
    spot_tokens: list[str] | None = None
    # The moderation hook's watch of the answer (``moderation.answer_watch.AnswerWatch``), from its first token.
    moderation: Any = None

    @classmethod
    def claimed(cls, message_id: str, work: Work | EmbedWork, *, spot_checked: bool) -> InFlight:
        if isinstance(work, Work):
            return cls(message_id, work, None, spot_tokens=[] if spot_checked else None)
        return cls(message_id, None, EmbeddingAssembly(len(work.inputs)))

    def take_token_frame(self, session_id: str) -> bool:
        """Count a token frame; False past the job's cap (logged once): it is dropped."""
        self.token_frames += 1
        if self.work is None or self.token_frames <= token_cap(self.work):
            return True
        if self.token_frames == token_cap(self.work) + 1:
            logger.warning(
                "worker {} sent more tokens for message {} than it may ({}): the rest are dropped",
                session_id,
                self.message_id,
                token_cap(self.work),
            )
        return False

    def kv_room(self) -> int:
        """The KV-cache tokens the job may hold, as its placement counts them: its prompt (four characters a
        token, as the fair queue's tickets estimate it) and the tokens it may generate. 0 for embeddings."""
        if self.work is None:
            return 0
        work = self.work
        characters = sum(len(turn.content or "") for turn in work.thread)
        characters += len(work.system_prompt or "") + len(work.raw_prompt or "")
        return characters // CHARS_PER_TOKEN + work.sampling_parameters.max_new_tokens

    def first_token(self) -> float | None:
        """Mark the first token's time; the time from dispatch to it, once (None after)."""
        if self.first_token_at is not None:
            return None
        self.first_token_at = time.monotonic()
        return self.first_token_at - self.dispatched_at


class InFlightMessages:
    """A connection's records, by message id."""

    def __init__(self) -> None:
        self._held: dict[str, InFlight] = {}

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._held

    def __len__(self) -> int:
        return len(self._held)

    def ids(self) -> KeysView[str]:
        return self._held.keys()

    def get(self, message_id: str) -> InFlight | None:
        return self._held.get(message_id)

    def add(self, record: InFlight) -> None:
        self._held[record.message_id] = record

    def remove(self, message_id: str) -> InFlight | None:
        """The one place a record ends (completed, failed, released, lost with the socket)."""
        return self._held.pop(message_id, None)
