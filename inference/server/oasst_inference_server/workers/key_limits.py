"""What a worker's key allows, kept for the life of its socket: the handshake checks the first
``worker_info`` against it (``auth.worker_keys.key_refusal``), and a protocol 6 worker's later ones, after a
model switch, are held to the same limits; the model configs it lists as servable are cut to those its key
allows."""

from __future__ import annotations

from dataclasses import dataclass

from oasst_shared.protocol import SWITCHING_PROTOCOL_VERSION, ServableModel, WorkerInfo


@dataclass(frozen=True)
class KeyLimits:
    max_slots: int
    allowed_models: list[str] | None = None  # None: any model config

    def allows(self, model: str) -> bool:
        return self.allowed_models is None or model in self.allowed_models

    def slots_refusal(self, info: WorkerInfo) -> str | None:
        if info.max_parallel_requests > self.max_slots:
            return (
                f"the worker announces {info.max_parallel_requests} slots; its key allows at most "
                f"{self.max_slots}"
            )
        return None

    def servable(self, info: WorkerInfo, protocol_version: int) -> dict[str, ServableModel]:
        """The model configs the worker may be told to load: those it lists (protocol 6 only; at most
        ``MAX_SERVABLE_MODELS``, checked by the frame's schema) that its key allows."""
        if protocol_version < SWITCHING_PROTOCOL_VERSION:
            return {}
        return {s.config.name: s for s in info.servable if self.allows(s.config.name)}
