"""Telling a storage outage (the database or the broker unreachable for a while) from a real fault.

An outage is waited out where work is in flight (a worker's connection retries its step) and answered
with 503 and ``Retry-After`` where a client asks (the API), never with a 500 or a closed socket.
"""

from __future__ import annotations

import asyncio

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from oasst_inference_server.broker import BrokerError

# Seconds a client is told to wait before asking again during an outage.
RETRY_AFTER_SECONDS = 5


def is_outage(exc: BaseException) -> bool:
    """A storage hiccup, not a fault of the request or frame at hand."""
    if isinstance(exc, (BrokerError, ConnectionError, PoolTimeoutError, asyncio.TimeoutError)):
        return True
    if isinstance(exc, OSError):
        return exc.errno is not None  # refused, reset, unreachable (not a file error without one)
    if isinstance(exc, (OperationalError, InterfaceError)):
        return True
    if isinstance(exc, DBAPIError):
        # Lost connections, and the server's own "shutting down" / "starting up" / "too many clients"
        # (SQLSTATE classes 08 and 57P, and 53300); never a data error such as a NUL in text.
        sqlstate = str(getattr(exc.orig, "sqlstate", "") or "")
        return exc.connection_invalidated or sqlstate.startswith(("08", "57P")) or sqlstate == "53300"
    return False
