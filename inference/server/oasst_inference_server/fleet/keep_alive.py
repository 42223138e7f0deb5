"""Which workers have been idle past their model's ``keep_alive`` (a pure function over the sessions).

A worker is unloaded (``unload_model``) when it can switch, serves its model (loaded, not switching),
holds no work, has been idle for the model config's ``keep_alive`` seconds, and nothing waits in that
model's queue. A null ``keep_alive`` never unloads. Its replica checks again that it holds no work when the
command arrives (the record may be a ping interval old).
"""

from __future__ import annotations

from collections.abc import Mapping

from oasst_inference_server.broker import WorkerSession


def idle_past_keep_alive(
    sessions: Mapping[str, WorkerSession], queued: Mapping[str, int], now: float
) -> list[tuple[str, str]]:
    """(session id, model) of each worker to unload now. ``queued``: hints waiting per model (at least
    for every model of :func:`keep_alive_models`)."""
    idle = []
    for session_id, session in sorted(sessions.items()):
        model = session.serves
        keep_alive = session.model_config_.keep_alive
        if model is None or keep_alive is None or not session.switchable or session.draining:
            continue
        if session.in_flight or session.idle_since is None or now - session.idle_since < keep_alive:
            continue
        if queued.get(model, 0) > 0:
            continue
        idle.append((session_id, model))
    return idle


def keep_alive_models(sessions: Mapping[str, WorkerSession]) -> set[str]:
    """The models some worker may be unloaded from (whose queue lengths the check needs)."""
    return {
        s.model_config_.name
        for s in sessions.values()
        if s.serves is not None and s.switchable and s.model_config_.keep_alive is not None
    }
