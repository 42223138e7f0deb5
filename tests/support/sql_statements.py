"""The SQL statements an in-process app sends, recorded for tests that count round trips."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI
from sqlalchemy import event


@contextlib.contextmanager
def recorded_statements(app: FastAPI, about: str | None = None) -> Iterator[list[str]]:
    """The statements the app's engines send inside the block (the request pool's and the silent streams'
    state checks' own), whitespace collapsed, in order; with ``about``, only those among whose bound
    parameters it is (a message id: the app's background work reads other messages too)."""
    statements: list[str] = []
    engines = [app.state.session_factory.kw["bind"].sync_engine]
    state_check_engine = getattr(app.state, "state_check_engine", None)
    if state_check_engine is not None and state_check_engine.sync_engine is not engines[0]:
        engines.append(state_check_engine.sync_engine)

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        if about is None or about in str(parameters):
            statements.append(" ".join(statement.split()))

    for engine in engines:
        event.listen(engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", record)
