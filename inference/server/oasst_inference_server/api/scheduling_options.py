"""The scheduling options a request may carry, as headers (the same on /chats and /v1):

* ``X-Queue-Timeout: <seconds>`` - fail the message if no worker took it within this time (at most
  ``settings.queue_timeout``, which applies when the header is absent);
* ``X-Priority: <int>`` - trusted clients only (with a valid ``TrustedClient`` header), within
  ``[-settings.max_request_priority, settings.max_request_priority]``; each step doubles (or halves)
  the request's weight in its user's fair share.
"""

from __future__ import annotations

import math
from typing import Annotated

from fastapi import Header

from oasst_inference_server.auth.trusted_client import TRUSTED_CLIENT_HEADER, is_trusted_header
from oasst_inference_server.domain_errors import InvalidValue, NotPermitted
from oasst_inference_server.settings import Settings
from oasst_shared.schemas import SchedulingRequest


def parse_scheduling_request(
    settings: Settings, priority: str | None, queue_timeout: str | None, trusted_client: str | None
) -> SchedulingRequest:
    requested = SchedulingRequest()
    if priority is not None:
        if trusted_client is None or not is_trusted_header(settings, trusted_client):
            raise NotPermitted("priority_not_allowed", "only trusted clients may set X-Priority")
        try:
            value = int(priority.strip())
        except ValueError:
            raise InvalidValue("invalid_priority", "X-Priority must be an integer") from None
        bound = settings.max_request_priority
        if abs(value) > bound:
            raise InvalidValue("invalid_priority", f"X-Priority must be within [-{bound}, {bound}]")
        requested.priority = value
    if queue_timeout is not None:
        try:
            seconds = float(queue_timeout.strip())
        except ValueError:
            seconds = math.nan
        if not math.isfinite(seconds) or not 0 < seconds <= settings.queue_timeout:
            raise InvalidValue(
                "invalid_queue_timeout",
                f"X-Queue-Timeout must be seconds in (0, {settings.queue_timeout:g}]",
            )
        requested.queue_timeout = seconds
    return requested


PriorityHeader = Annotated[str | None, Header(alias="X-Priority", description="Trusted clients only")]
QueueTimeoutHeader = Annotated[
    str | None, Header(alias="X-Queue-Timeout", description="Seconds the request may wait for a worker")
]
TrustedClientHeader = Annotated[str | None, Header(alias=TRUSTED_CLIENT_HEADER, include_in_schema=False)]
