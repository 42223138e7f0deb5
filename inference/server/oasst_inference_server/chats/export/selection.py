"""Which chats an export takes: those that allow data use, optionally in a time window, of one user, or
of deleted accounts too."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from oasst_inference_server.domain_errors import InvalidValue


def as_utc(moment: datetime | None) -> datetime | None:
    """A moment without a time zone is taken as UTC (as the database stores them)."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class ExportSelection:
    """The chats to export. Every chat taken allows data use (``allow_data_use``, the chat's consent)."""

    # Chats created at or after ``since`` and before ``until`` (UTC when no zone is given).
    since: datetime | None = None
    until: datetime | None = None
    # Also the chats an account kept when it was deleted (they allowed data use); their nodes say
    # ``deleted: true``.
    include_deleted: bool = False
    # Only this user's chats.
    user_id: str | None = None

    def __post_init__(self) -> None:
        since, until = as_utc(self.since), as_utc(self.until)
        if since is not None and until is not None and since >= until:
            raise InvalidValue("invalid_window", "since must be before until", param="since")
        object.__setattr__(self, "since", since)
        object.__setattr__(self, "until", until)
