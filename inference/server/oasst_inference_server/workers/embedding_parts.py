"""Assembling an embedding result a worker sends in several frames (protocol 4), bounded.

A result too large for one frame comes as ``embeddings_part`` frames, in order, then the ``embeddings``
frame with the last vectors (:func:`oasst_shared.protocol.embeddings_frames`). The server holds the parts
of a job only while it is in flight, and never more than the job asked for: one vector per input, each
of one dimension (set by the first vector, at most ``MAX_EMBEDDING_DIMENSION``). A part out of order, one
vector too many or of another dimension, or a result with too few, is refused (:class:`PartRefused`), and
only that job fails.
"""

from __future__ import annotations

from oasst_shared.protocol import MAX_EMBEDDING_DIMENSION, Embeddings, EmbeddingsPart


class PartRefused(Exception):
    """The worker's frames do not make up the job's result; the message is what it says."""


class EmbeddingAssembly:
    """The vectors of one embedding job received so far."""

    def __init__(self, inputs: int) -> None:
        self.inputs = inputs
        self.vectors: list[list[float]] = []
        self.dimension: int | None = None

    def add(self, part: EmbeddingsPart) -> None:
        """Keep a part's vectors; raises :class:`PartRefused` for one that does not continue the result
        or would leave no vector for the final frame."""
        if part.start != len(self.vectors):
            raise PartRefused(f"an embeddings part starts at {part.start}, not at {len(self.vectors)}")
        if len(self.vectors) + len(part.embeddings) >= self.inputs:
            raise PartRefused(
                f"embeddings parts carry {len(self.vectors) + len(part.embeddings)} vectors before the "
                f"final frame, for {self.inputs} inputs"
            )
        self._check(part.embeddings)
        self.vectors.extend(part.embeddings)

    def result(self, final: Embeddings) -> Embeddings:
        """The whole result, the parts' vectors and then the final frame's; raises :class:`PartRefused`
        unless that makes exactly one vector per input."""
        total = len(self.vectors) + len(final.embeddings)
        if total != self.inputs:
            raise PartRefused(f"the worker sent {total} vectors for {self.inputs} inputs")
        self._check(final.embeddings)
        if not self.vectors:
            return final
        # Built without validation: every vector was validated as its frame was read.
        return Embeddings.model_construct(
            message_id=final.message_id,
            embeddings=self.vectors + final.embeddings,
            prompt_tokens=final.prompt_tokens,
        )

    def _check(self, vectors: list[list[float]]) -> None:
        dimension = self.dimension if self.dimension is not None else len(vectors[0])
        if not 0 < dimension <= MAX_EMBEDDING_DIMENSION:
            raise PartRefused(
                f"embedding vectors of {dimension} dimensions (the protocol carries 1 to "
                f"{MAX_EMBEDDING_DIMENSION})"
            )
        if any(len(v) != dimension for v in vectors):
            raise PartRefused(f"embedding vectors of several dimensions (the first has {dimension})")
        self.dimension = dimension
