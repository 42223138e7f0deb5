"""No request waits for the thread pool: FastAPI runs a plain ``def`` endpoint or dependency in its
thread pool (a lock, a condition and two thread switches per call), so every endpoint and every
dependency of the app is async."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, APIWebSocketRoute

from tests.support.api import API

pytestmark = API


def _runs_on_the_loop(call: Any) -> bool:
    if inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call):
        return True
    if inspect.isfunction(call) or inspect.isclass(call):
        return False
    method = type(call).__call__  # an instance, as fastapi.security's schemes
    return inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method)


def _api_routes(routes: list[Any]) -> Iterator[APIRoute | APIWebSocketRoute]:
    for route in routes:
        included = getattr(route, "original_router", None)  # FastAPI's wrapper of an included router
        if included is not None:
            yield from _api_routes(included.routes)
        elif isinstance(route, APIRoute | APIWebSocketRoute):
            yield route


def _in_the_thread_pool(dependant: Dependant, where: str) -> Iterator[str]:
    for sub in dependant.dependencies:
        if sub.call is not None and not _runs_on_the_loop(sub.call):
            yield f"{where}: dependency {getattr(sub.call, '__name__', sub.call)!r}"
        yield from _in_the_thread_pool(sub, where)


async def test_every_endpoint_and_dependency_runs_on_the_event_loop(app: FastAPI) -> None:
    found: list[str] = []
    routes = list(_api_routes(app.routes))
    assert len(routes) > 20
    for route in routes:
        where = f"{','.join(sorted(getattr(route, 'methods', None) or {'WS'}))} {route.path}"
        if not _runs_on_the_loop(route.endpoint):
            found.append(f"{where}: endpoint")
        found.extend(_in_the_thread_pool(route.dependant, where))
    assert not found, "\n".join(sorted(set(found)))
