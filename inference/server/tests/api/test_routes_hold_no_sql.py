"""Route modules hold no SQL: they call the services that own the data (the lint contract "server routes
hold no SQL" keeps SQLAlchemy and SQLModel imports out of them; this test keeps out queries made through
the database session itself, which need no import)."""

from __future__ import annotations

import ast
from pathlib import Path

import oasst_inference_server.api.routes as routes

_SESSION_QUERIES = {
    "exec",
    "execute",
    "get",
    "add",
    "add_all",
    "delete",
    "commit",
    "scalar",
    "scalars",
    "merge",
}


def _session_queries(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "session"
            and node.func.attr in _SESSION_QUERIES
        ):
            found.append(f"{path.name}:{node.lineno} session.{node.func.attr}")
    return found


def test_route_modules_make_no_queries_through_the_session() -> None:
    modules = sorted(Path(routes.__file__).parent.glob("*.py"))
    assert modules
    assert [q for path in modules for q in _session_queries(path)] == []
