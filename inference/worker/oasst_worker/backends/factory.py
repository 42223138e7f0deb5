from __future__ import annotations

from oasst_worker.backends.base import Backend
from oasst_worker.settings import WorkerSettings


def create_backend(settings: WorkerSettings) -> Backend:
    if settings.backend_kind == "tgi":
        from oasst_worker.backends.tgi import TgiBackend

        return TgiBackend(
            settings.backend_url,
            token_timeout=settings.backend_token_timeout,
            generation_timeout=settings.backend_generation_timeout,
        )
    raise ValueError(f"unknown backend kind {settings.backend_kind!r}")
