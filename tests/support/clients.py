"""HTTP clients a test opens without a ``with`` block: registered here, closed at the end of the session
(the root conftest), so none is left to the garbage collector (its ResourceWarning fails the run)."""

from __future__ import annotations

from typing import Protocol, TypeVar


class _Closeable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=_Closeable)
_open: list[_Closeable] = []


def closing(client: C) -> C:
    """``client``, closed at the end of the test session."""
    _open.append(client)
    return client


def close_all() -> None:
    while _open:
        _open.pop().close()
