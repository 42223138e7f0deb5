"""The SQL statements an in-process app sends, recorded for tests that count round trips."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI
from sqlalchemy import event


@contextlib.contextmanager
def recorded_statements(app: FastAPI) -> Iterator[list[str]]:
    """The statements the app's engine sends inside the block, whitespace collapsed, in order."""
    statements: list[str] = []
    engine = app.state.session_factory.kw["bind"].sync_engine

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(" ".join(statement.split()))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", record)
