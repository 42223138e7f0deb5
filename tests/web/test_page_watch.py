"""The page watch of the browser tests (web_support.PageWatch) tells a request the browser abandons
because its page is being replaced from one that failed: the first is not a problem, the second is."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse
from starlette.routing import Route

from tests.support.fake_oauth import ServerThread
from tests.support.processes import free_port
from tests.web.web_support import PageWatch

DOCUMENT_DELAY = 1.5  # s: how long a navigation is on its way


async def document(request: Request) -> HTMLResponse:
    await asyncio.sleep(float(request.query_params.get("delay", "0")))
    return HTMLResponse("<!doctype html><link rel=icon href='data:,'><title>watch</title><p>page</p>")


async def slow(request: Request) -> PlainTextResponse:
    for _ in range(300):  # up to 30 s, over as soon as the browser lets go
        if await request.is_disconnected():
            break
        await asyncio.sleep(0.1)
    return PlainTextResponse("late")


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    port = free_port()
    app = Starlette(routes=[Route("/", document), Route("/slow", slow)])
    with ServerThread(app, port):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture
def watched(browser) -> Iterator[tuple[Page, PageWatch, list[str]]]:
    """A page under a watch, and a log of its events in the order Playwright delivered them."""
    context = browser.new_context()
    watch = PageWatch()
    events: list[str] = []
    context.on("page", watch.attach)
    page = context.new_page()
    page.on("request", lambda r: events.append(f"request {r.url}"))
    page.on("requestfailed", lambda r: events.append(f"failed {r.url} {r.failure}"))
    yield page, watch, events
    context.close()


def wait_for(page: Page, event: str, events: list[str]) -> None:
    """Playwright delivers a failure some time after the browser gave up the request."""
    for _ in range(100):
        if event in events:
            return
        page.wait_for_timeout(50)
    raise AssertionError(f"no {event!r} in {events}")


def test_a_request_started_while_a_reload_is_on_its_way_is_abandoned_not_failed(site, watched):
    page, watch, events = watched
    page.goto(f"{site}/?delay={DOCUMENT_DELAY}")
    # The outgoing document starts a request once the reload has begun; the new document replaces it.
    page.evaluate("setTimeout(() => fetch('/slow').catch(() => {}), 500)")
    page.reload()
    wait_for(page, f"failed {site}/slow net::ERR_ABORTED", events)
    reload_request = events.index(f"request {site}/?delay={DOCUMENT_DELAY}", 1)
    assert events.index(f"request {site}/slow") > reload_request, events  # started during the reload
    assert watch.unexpected() == []


def test_a_request_aborted_with_no_navigation_is_a_problem(site, watched):
    page, watch, events = watched
    page.goto(site)
    page.evaluate("""() => {
        const controller = new AbortController();
        fetch('/slow', { signal: controller.signal }).catch(() => {});
        setTimeout(() => controller.abort(), 200);
    }""")
    wait_for(page, f"failed {site}/slow net::ERR_ABORTED", events)
    assert watch.unexpected() == [("failed", f"{site}/slow", "net::ERR_ABORTED")]


def test_a_request_that_fails_is_a_problem_even_during_a_reload(site, watched):
    page, watch, events = watched
    closed = f"http://127.0.0.1:{free_port()}/nothing-listens-here"
    page.goto(f"{site}/?delay={DOCUMENT_DELAY}")
    page.evaluate(f"setTimeout(() => fetch('{closed}', {{ mode: 'no-cors' }}).catch(() => {{}}), 300)")
    page.reload()
    problems = [p for p in watch.unexpected() if p[0] == "failed"]
    assert problems and problems[0][1] == closed and problems[0][2] != "net::ERR_ABORTED", watch.problems
