"""The SQL statements an in-process app sends, recorded for tests that count round trips."""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Iterator
from typing import Any

import asyncpg
from fastapi import FastAPI
from sqlalchemy import event

# The asyncpg calls the driver path (oasst_inference_server.db.driver) makes; SQLAlchemy's own statements
# go through prepared statements, not these, so nothing is recorded twice.
_DRIVER_CALLS = ("execute", "fetch", "fetchrow", "fetchval")
# asyncpg's transactions (SQLAlchemy's too) begin and end through ``execute``: not statements of the app's.
_TRANSACTION_CONTROL = re.compile(r"\s*(BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE)\b", re.IGNORECASE)


class Statements(list[str]):
    """Statements in order; ``driver``: those of them sent straight on asyncpg (``db.driver``)."""

    def __init__(self) -> None:
        super().__init__()
        self.driver: list[str] = []


@contextlib.contextmanager
def recorded_statements(app: FastAPI, about: str | None = None) -> Iterator[Statements]:
    """The statements the app's engines send inside the block (the request pool's, the silent streams'
    state checks' own and the answers' ends', through SQLAlchemy or straight on asyncpg:
    ``db.driver``), whitespace collapsed, in order; with ``about``, only those among whose bound
    parameters it is (a message id: the app's background work reads other messages too)."""
    statements = Statements()
    engines = [app.state.session_factory.kw["bind"].sync_engine]
    for name in ("state_check_engine", "answer_engine"):
        own = getattr(app.state, name, None)
        if own is not None and own.sync_engine not in engines:
            engines.append(own.sync_engine)

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        if about is None or about in str(parameters):
            statements.append(" ".join(statement.split()))

    for engine in engines:
        event.listen(engine, "before_cursor_execute", record)
    try:
        with _driver_statements(statements, about):
            yield statements
    finally:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", record)


@contextlib.contextmanager
def _driver_statements(statements: Statements, about: str | None) -> Iterator[None]:
    """Record the statements made straight on asyncpg connections (every one of the process's) while the
    block runs, as they are sent (asyncpg's own query loggers are called later, from the event loop)."""
    originals = {name: getattr(asyncpg.Connection, name) for name in _DRIVER_CALLS}

    def recording(call: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(call)
        async def wrapper(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
            if not _TRANSACTION_CONTROL.match(query) and (about is None or about in str(args)):
                statements.append(" ".join(query.split()))
                statements.driver.append(statements[-1])
            return await call(self, query, *args, **kwargs)

        return wrapper

    for name, call in originals.items():
        setattr(asyncpg.Connection, name, recording(call))
    try:
        yield
    finally:
        for name, call in originals.items():
            setattr(asyncpg.Connection, name, call)
