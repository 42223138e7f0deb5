"""What a worker connection holds back for the jobs it sent before their claim was committed.

A connection sends a job as soon as the claim's ``UPDATE`` has taken the message (its row stays locked,
so no other session can take it), and commits while the frame travels: the commit's disk flush is then
off the dispatch path. Until the commit is confirmed, nothing the worker sends for that message is
handled (:meth:`ClaimGate.wait`): no token reaches a reader, no result is stored. A job whose commit
failed becomes *void*: the worker is told to cancel it, its tokens are dropped, and its terminal frame
only frees the slot (the message itself is re-queued or, if the commit did land, retried).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from oasst_shared.protocol import TokenBatch, WorkerFrame
from oasst_shared.token_frames import TokenFrames


def named_messages(frame: WorkerFrame | TokenFrames) -> Iterable[str]:
    """The message ids a worker frame speaks of."""
    if isinstance(frame, (TokenFrames, TokenBatch)):
        return {token.message_id for token in frame.tokens}
    message_id = getattr(frame, "message_id", None)
    return (message_id,) if isinstance(message_id, str) else ()


class ClaimGate:
    def __init__(self) -> None:
        self._unconfirmed: dict[str, asyncio.Future[None]] = {}
        self.void: set[str] = set()

    def opened(self, message_id: str) -> None:
        """The job was claimed but not committed yet (it may be sent)."""
        self._unconfirmed[message_id] = asyncio.get_running_loop().create_future()

    def settled(self, message_id: str, *, void: bool = False) -> None:
        """The claim's transaction ended; ``void``: the job was sent but its claim did not hold."""
        waiter = self._unconfirmed.pop(message_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if void:
            self.void.add(message_id)

    def unconfirmed(self) -> set[str]:
        return set(self._unconfirmed)

    @property
    def open(self) -> bool:
        """Whether any claim is still unconfirmed (the usual answer, on the token path, is no)."""
        return bool(self._unconfirmed)

    async def wait(self, message_ids: Iterable[str]) -> None:
        """Until the claims of these messages (if any is open) are settled."""
        if not self._unconfirmed:
            return
        for message_id in message_ids:
            waiter = self._unconfirmed.get(message_id)
            if waiter is not None:
                await asyncio.shield(waiter)
