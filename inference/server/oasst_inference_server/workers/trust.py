"""How far the server trusts one worker socket (pure): trusted keys, flagged keys, and which user work
an untrusted worker may take.

A worker key is *trusted* when the operator says so (``DbWorker.trusted`` through the admin API, or a key
of ``settings.trusted_worker_api_keys``); every other key is untrusted. Untrusted workers are
compliance-checked (:mod:`.compliance`); a key that fails too many checks is *flagged*. A flagged
worker, and an untrusted worker of a model config in ``settings.trusted_workers_only_models``, keeps
its socket (and finishes the work it holds) but the dispatcher gives it no user work.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class WorkerTrust:
    trusted: bool = False
    flagged: bool = False
    flag_reason: str | None = None

    def may_take_user_work(self, model: str, trusted_only_models: list[str]) -> bool:
        if self.flagged:
            return False
        return self.trusted or model not in trusted_only_models
