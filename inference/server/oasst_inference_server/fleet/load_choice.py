"""Which worker loads a model nobody serves (pure functions over the worker sessions).

A model *needs a load* when no worker serves it (loaded, not switching away) and none is loading it.
The worker told to load it is, among those that list it as servable and may take its user work:

1. one whose backend holds no model (``loaded`` false): it serves nothing now;
2. else one that holds no work and whose model has nothing queued;
3. else any other, the least busy first; but never the last worker of a model that has queued or
   running work (that model would then wait for a load in turn).

Within a rank, the one whose last load of the model was fastest, then the lower session id. A worker
whose load of this model failed less than ``retry_backoff`` seconds ago is skipped, so a model that cannot
load there is not retried in a loop.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

from oasst_inference_server.broker import WorkerSession


def loaded_or_loading(model: str, sessions: Collection[WorkerSession]) -> bool:
    """Some worker serves ``model`` now or has been told to load it."""
    for session in sessions:
        if session.serves == model:
            return True
        if session.switch is not None and session.switch.model_config_name == model:
            return True
    return False


def models_to_load(sessions: Collection[WorkerSession]) -> set[str]:
    """The models some connected worker can load and nobody serves or is loading."""
    servable = {s.name for session in sessions if session.switchable for s in session.servable}
    return {model for model in servable if not loaded_or_loading(model, sessions)}


def worker_to_load(
    model: str,
    sessions: Mapping[str, WorkerSession],
    queued: Mapping[str, int],
    *,
    now: float,
    retry_backoff: float,
    trusted_only_models: Collection[str] = (),
) -> str | None:
    """The session id of the worker to tell to load ``model``, or None if none may now. ``queued``: the
    hints waiting in each model's queue (at least for the models the candidates serve)."""
    serving: dict[str, int] = {}
    for session in sessions.values():
        if session.serves is not None:
            serving[session.serves] = serving.get(session.serves, 0) + 1
    best: tuple[tuple[int, int, float, str], str] | None = None
    for session_id, session in sessions.items():
        if not _may_load(session, model, now, retry_backoff, trusted_only_models):
            continue
        busy = len(session.in_flight)
        if not session.loaded:
            rank = 0
        else:
            current = session.model_config_.name
            has_work = busy > 0 or queued.get(current, 0) > 0
            if has_work and serving.get(current, 0) <= 1:
                continue  # its model's last worker, and that model has work
            rank = 2 if has_work else 1
        load_seconds = next((s.load_seconds for s in session.servable if s.name == model), None)
        key = (rank, busy, load_seconds if load_seconds is not None else math.inf, session_id)
        if best is None or key < best[0]:
            best = (key, session_id)
    return best[1] if best is not None else None


def _may_load(
    session: WorkerSession, model: str, now: float, retry_backoff: float, trusted_only_models: Collection[str]
) -> bool:
    if not session.can_load(model) or session.switch is not None or session.draining or session.flagged:
        return False
    if session.serves == model:
        return False
    if model in trusted_only_models and not session.trusted:
        return False  # it would take none of the model's user work
    last = session.last_switch
    return not (
        last is not None
        and last.model_config_name == model
        and last.outcome == "failed"
        and now - last.finished_at < retry_backoff
    )
