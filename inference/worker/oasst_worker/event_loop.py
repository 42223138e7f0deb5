"""The worker's event loop: uvloop by default, asyncio's own where asked or where uvloop is missing.

At the model's pace every token is its own backend read and websocket write, so much of the worker's CPU
per token is the event loop's own (epoll, the transports' reads and writes), which libuv's loop does for
less (docs/performance.md, section 7b).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

from loguru import logger

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T], choice: Literal["uvloop", "asyncio"]) -> T:
    """Run ``main`` to its end on the chosen event loop, as ``asyncio.run`` does."""
    if choice == "uvloop":
        try:
            import uvloop
        except ImportError:  # Windows, or installed without the worker's dependencies
            logger.info("uvloop is not installed: running on asyncio's own event loop")
        else:
            return uvloop.run(main)
    return asyncio.run(main)
