"""No route or dependency runs in FastAPI's thread pool: a plain (``def``) dependency or endpoint is run
in a worker thread, a hand-off there and back on every request that uses it, on the way to the first
token. Every one of them is a coroutine function (or an async generator, or an object with an async
``__call__``, as FastAPI's security classes are)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

from fastapi.dependencies.models import Dependant
from fastapi.routing import iter_route_contexts

from oasst_inference_server.main import create_app
from oasst_inference_server.settings import Settings


def _runs_on_the_loop(call: Any) -> bool:
    if inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call):
        return True
    # An instance (a security scheme): FastAPI looks at its class's __call__.
    return not inspect.isroutine(call) and inspect.iscoroutinefunction(type(call).__call__)


def _calls(dependant: Dependant, where: str) -> Iterator[tuple[str, Any]]:
    if dependant.call is not None:
        yield where, dependant.call
    for sub in dependant.dependencies:
        yield from _calls(sub, where)


def test_every_endpoint_and_dependency_runs_on_the_event_loop() -> None:
    app = create_app(Settings(_env_file=None))  # type: ignore[call-arg]
    # The routes as FastAPI serves them, those of included routers with the routers' own dependencies.
    routes = [r for r in iter_route_contexts(app.routes) if getattr(r, "dependant", None) is not None]
    assert len(routes) > 20
    in_threads = sorted(
        {
            f"{where}: {getattr(call, '__qualname__', type(call).__name__)}"
            for route in routes
            for where, call in _calls(route.dependant, f"{sorted(route.methods or ['WS'])} {route.path}")
            if not _runs_on_the_loop(call)
        }
    )
    assert in_threads == []
