"""The classifier check: a text's embedding, from an embedding model served by the fleet, against the
embeddings of each category's examples; a category whose nearest example is at least its threshold in
cosine similarity is flagged, with that similarity as its score.

The embeddings come through the same submission path as ``/v1/embeddings`` (an :class:`Embedder`, built
in :mod:`..openai_api` and given to :class:`..moderation.hook.Moderation` at startup), so the classifier
runs on the fleet like any model. The examples' vectors are asked once per process, then kept.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from oasst_inference_server.settings_sections.moderation import ClassifierCategory

# (the user on whose behalf, the texts) -> one vector per text, in order.
Embedder = Callable[[str, list[str]], Awaitable[list[list[float]]]]


class ClassifierUnavailable(Exception):
    """No embedding could be had (no worker, a failure, the timeout)."""


@dataclass(frozen=True)
class Scores:
    """Each category's score (the nearest example's cosine similarity) and the flagged ones."""

    scores: dict[str, float]
    flagged: list[str]


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=False))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


class Classifier:
    def __init__(self, categories: Mapping[str, ClassifierCategory], timeout: float) -> None:
        self._categories = dict(categories)
        self._timeout = timeout
        self._examples: dict[str, list[list[float]]] | None = None
        self._lock = asyncio.Lock()
        self.embedder: Embedder | None = None  # set at startup

    def __bool__(self) -> bool:
        return bool(self._categories)

    async def _example_vectors(self, user_id: str) -> dict[str, list[list[float]]]:
        async with self._lock:
            if self._examples is None:
                names = list(self._categories)
                texts = [e for name in names for e in self._categories[name].examples]
                vectors = await self._embed(user_id, texts)
                examples: dict[str, list[list[float]]] = {}
                at = 0
                for name in names:
                    count = len(self._categories[name].examples)
                    examples[name] = vectors[at : at + count]
                    at += count
                self._examples = examples
            return self._examples

    async def _embed(
        self, user_id: str, texts: list[str], embedder: Embedder | None = None
    ) -> list[list[float]]:
        embedder = embedder or self.embedder
        if embedder is None:
            raise ClassifierUnavailable("the classifier has no embedder")
        try:
            vectors = await asyncio.wait_for(embedder(user_id, texts), self._timeout)
        except TimeoutError:
            raise ClassifierUnavailable(f"no embedding within {self._timeout:g}s") from None
        except ClassifierUnavailable:
            raise
        except Exception as exc:
            raise ClassifierUnavailable(f"{type(exc).__name__}: {exc}"[:300]) from exc
        if len(vectors) != len(texts):
            raise ClassifierUnavailable(f"{len(vectors)} embeddings for {len(texts)} texts")
        return vectors

    async def classify(
        self, user_id: str, texts: list[str], embedder: Embedder | None = None
    ) -> list[Scores]:
        """Each text's scores (``ClassifierUnavailable`` if the embeddings could not be had); ``embedder``:
        another way to embed the texts (a ``/v1/moderations`` request's, counted as the caller's)."""
        examples = await self._example_vectors(user_id)
        vectors = await self._embed(user_id, texts, embedder)
        results = []
        for vector in vectors:
            scores = {
                name: max(cosine(vector, example) for example in examples[name]) for name in self._categories
            }
            flagged = [name for name, score in scores.items() if score >= self._categories[name].threshold]
            results.append(Scores(scores, flagged))
        return results
