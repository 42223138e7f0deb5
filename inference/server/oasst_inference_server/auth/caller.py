"""Who makes a request of the OpenAI-compatible API (resolved by ``api.deps.get_caller``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from oasst_inference_server.db.models import DbUser
from oasst_shared.schemas import SchedulingRequest


@dataclass(frozen=True)
class Caller:
    """Who makes a request of the OpenAI-compatible API: a user, through one of their API keys or not."""

    user: DbUser
    api_key_id: str | None = None
    scheduling: SchedulingRequest = field(default_factory=SchedulingRequest)
