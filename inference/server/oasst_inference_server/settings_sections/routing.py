"""Settings section: model aliases and fallbacks."""

from __future__ import annotations

from pydantic import BaseModel, Field


class _ModelAliasesAndFallbacksSettings(BaseModel):
    """Settings: model aliases and fallbacks."""

    fallback_queue_length: int | None = Field(
        default=None,
        ge=1,
        description="A model with fallbacks whose queue holds this many messages hands new requests to its "
        "next fallback with room (docs/operating.md#model-aliases-and-fallbacks); unset: `max_queue_size`, so a request its own "
        "model would refuse as `queue_full` is served by a fallback instead",
    )
    alias_cache_seconds: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="Longest a replica uses the aliases it read without reading them again. A change through "
        "the admin API or CLI reaches every replica at once through the broker; this bounds the time when "
        "the broker missed one (it was flushed, or the CLI ran with the in-process broker)",
    )
