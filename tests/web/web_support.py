"""Helpers of the browser tests: a page with a watch on everything that goes wrong in it (console
errors, page errors, failed requests, error responses), and a view of the same user through the API
to check what the page claims against the server."""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import BrowserContext, Locator, Page, Request, Response, expect

from tests.support.clients import closing

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = Path(os.environ.get("OASST_WEB_SCREENSHOTS", ROOT / "build" / "web-screenshots"))
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
ANSWER_TIMEOUT = 180_000  # ms: the CPU model shares two cores with the rest of the suite
_LOAD_FAILURE = re.compile(r"^Failed to load resource")


def wait_until(condition: Callable[[], object], timeout: float = 30, what: str = "the condition") -> None:
    """Poll ``condition`` (a server-side check) until it holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def new_name(prefix: str = "web") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@dataclass
class PageWatch:
    """Collects what goes wrong in a browser context. Tests declare what they provoke with
    ``allow``; ``assert_clean`` fails on anything else. A "Failed to load resource" console error
    belongs to its request and is allowed with it.

    One thing is not a failure: a request the browser abandons because its page is being replaced
    (a reload, a link followed) ends as ``net::ERR_ABORTED``. Such a request belongs to a document
    older than the page's newest navigation, which is how it is told apart: it was started before that
    navigation began, or while it was on its way (the outgoing document runs until the new one
    arrives). So does a request still in flight when the test closes the page."""

    problems: list[tuple[str, str, str]] = field(default_factory=list)  # (kind, url, text)
    allowed: list[tuple[str, str]] = field(default_factory=list)  # (kind, url substring)
    _navigations: dict[Page, int] = field(default_factory=dict)
    _started_in: dict[Request, int] = field(default_factory=dict)
    _arriving: dict[Page, Request | None] = field(default_factory=dict)  # a navigation on its way
    closing: bool = False  # the test closes the page: what it still had in flight is abandoned

    def attach(self, page: Page) -> None:
        self._navigations[page] = 0
        page.on("console", lambda m: self._console(m.type, m.text, m.location.get("url", "")))
        page.on("pageerror", lambda e: self.problems.append(("pageerror", page.url, str(e))))
        page.on("request", lambda r: self._request(page, r))
        page.on("requestfailed", lambda r: self._failed(page, r))
        page.on("response", lambda r: self._response(page, r))

    def _request(self, page: Page, request: Request) -> None:
        if request.is_navigation_request() and request.frame == page.main_frame:
            self._navigations[page] += 1
            self._arriving[page] = request
            self._started_in[request] = self._navigations[page]
        else:
            # While a navigation is on its way, requests still come from the outgoing document.
            self._started_in[request] = self._navigations[page] - (1 if self._arriving.get(page) else 0)

    def _response(self, page: Page, response: Response) -> None:
        if response.request == self._arriving.get(page):
            self._arriving[page] = None
        if response.status >= 400:
            self.problems.append((f"status {response.status}", response.url, response.status_text))

    def _failed(self, page: Page, request: Request) -> None:
        if request == self._arriving.get(page):
            self._arriving[page] = None
        abandoned = request.failure == "net::ERR_ABORTED" and (
            self.closing or self._started_in.get(request, 0) < self._navigations[page]
        )
        if not abandoned:
            self.problems.append(("failed", request.url, str(request.failure)))

    def _console(self, kind: str, text: str, url: str) -> None:
        if kind in ("error", "warning"):
            self.problems.append(("load" if _LOAD_FAILURE.match(text) else f"console {kind}", url, text))

    def allow(self, kind: str, url_part: str) -> None:
        """Expect ``kind`` ("failed" or "status 429"...) for URLs containing ``url_part``."""
        self.allowed.append((kind, url_part))

    def unexpected(self) -> list[tuple[str, str, str]]:
        def ok(kind: str, url: str) -> bool:
            return any((kind == k or kind == "load") and part in url for k, part in self.allowed)

        return [p for p in self.problems if not ok(p[0], p[1])]

    def assert_clean(self) -> None:
        problems = self.unexpected()
        assert not problems, "the page had problems:\n" + "\n".join(map(str, problems))

    def seen(self, kind: str, url_part: str) -> int:
        return sum(1 for k, url, _ in self.problems if k == kind and url_part in url)


class WebPage:
    """The chat page in one browser context (its own storage: one signed-in user)."""

    def __init__(self, context: BrowserContext, base_url: str):
        self.context = context
        self.base_url = base_url
        self.watch = PageWatch()
        context.on("page", self.watch.attach)
        self.page = context.new_page()

    def goto(self, path: str = "/") -> None:
        self.page.goto(self.base_url + path)

    def sign_in(self, name: str) -> None:
        self.goto()
        self.page.fill("#dev-username", name)
        self.page.click("#dev-signin button[type=submit]")
        expect(self.page.locator("#app")).to_be_visible()
        expect(self.page.locator("#account-name")).to_have_text(name)

    def send(self, text: str) -> None:
        self.page.fill("#input", text)
        self.page.press("#input", "Enter")

    @property
    def answers(self) -> Locator:
        return self.page.locator("#thread .msg.assistant")

    @property
    def prompts(self) -> Locator:
        return self.page.locator("#thread .msg.prompter")

    def answer_text(self, index: int = -1) -> str:
        return self.answers.nth(index).locator(".msg-body").inner_text()

    def wait_answered(self, index: int = -1) -> Locator:
        answer = self.answers.nth(index)
        expect(answer).to_have_attribute("aria-busy", "false", timeout=ANSWER_TIMEOUT)
        return answer

    def chat_id(self) -> str:
        match = re.search(r"/c/([0-9a-f-]+)$", self.page.url)
        assert match, self.page.url
        return match.group(1)

    def tokens(self) -> dict[str, Any]:
        return self.page.evaluate("() => JSON.parse(localStorage.getItem('oasst.session'))")

    def screenshot(self, name: str) -> None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), animations="disabled")

    def close(self) -> None:
        self.watch.closing = True
        self.context.close()


class ServerView:
    """The same user through the REST API (a debug login of the same name is the same account)."""

    def __init__(self, base_url: str, name: str):
        self.http = closing(httpx.Client(base_url=base_url, timeout=30))
        login = self.http.get("/auth/callback/debug", params={"code": name})
        login.raise_for_status()
        self.http.headers["Authorization"] = f"Bearer {login.json()['access_token']['access_token']}"

    def get(self, path: str, **params: Any) -> Any:
        response = self.http.get(path, params=params)
        response.raise_for_status()
        return response.json()

    def call(self, method: str, path: str, body: Any = None) -> httpx.Response:
        return self.http.request(method, path, json=body)

    def chat(self, chat_id: str) -> dict[str, Any]:
        return self.get(f"/chats/{chat_id}")

    def message(self, chat_id: str, message_id: str) -> dict[str, Any]:
        return self.get(f"/chats/{chat_id}/messages/{message_id}")

    def use_settings(self, **settings: Any) -> None:
        self.call("PUT", "/account/settings", settings).raise_for_status()

    def close(self) -> None:
        self.http.close()
