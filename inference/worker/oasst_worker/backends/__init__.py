from oasst_worker.backends.base import (
    Backend,
    BackendError,
    BackendInfo,
    EmbeddingResult,
    GenerationResult,
    StreamedToken,
)
from oasst_worker.backends.factory import create_backend

__all__ = [
    "Backend",
    "BackendError",
    "BackendInfo",
    "EmbeddingResult",
    "GenerationResult",
    "StreamedToken",
    "create_backend",
]
