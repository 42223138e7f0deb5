"""What every job gets: the function that writes a frame to the server."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pydantic import BaseModel

# Writes one frame to the server; raises websockets' ConnectionClosed when the connection is gone.
Send = Callable[[BaseModel], Awaitable[None]]
