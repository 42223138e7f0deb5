"""Worker session records as a connected worker of a model would publish them."""

from __future__ import annotations

from oasst_inference_server.broker import WorkerSession, WorkerSessionRecord
from oasst_shared.model_configs import SMOLLM2_135M


def worker_session(model: str, *, free_slots: int = 0, max_parallel_requests: int = 2) -> WorkerSession:
    """A session of a worker of ``model`` (SmolLM2's config under that name) that takes no work."""
    return WorkerSession(
        model_config=SMOLLM2_135M.model_copy(update={"name": model}),
        max_parallel_requests=max_parallel_requests,
        free_slots=free_slots,
        backend_kind="fake",
        worker_version="test",
        connected_at=0.0,
    )


def session_record(session_id: str, model: str, *, free_slots: int = 0) -> WorkerSessionRecord:
    return worker_session(model, free_slots=free_slots).record(session_id)
