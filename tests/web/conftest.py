"""Fixtures of the browser tests: Debian's Chromium driven by Playwright, and one stack shared by the
tests (server on SQLite with the in-process broker, as `make up` runs it, one worker, the real CPU
backend), with a fake OAuth provider and a rate limit the tests can reach."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.support import fake_oauth
from tests.support.fake_workers import FakeBackend, fake_model, start_fake_worker
from tests.support.processes import ManagedProcess, free_port, spawn, wait_http_ok
from tests.support.stacks import BackendProcess, Stack, start_stack
from tests.web.web_support import DESKTOP, ROOT, WebPage

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# The machine's network is closed: Chromium must not try its background connections.
CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
AUTH_SECRET = "web-tests-auth-secret-0123456789abcdef"
ADMIN_ROOT_TOKEN = "web-tests-admin-root-token-0123456789"
RATE_LIMIT_PER_MINUTE = 12
HOSTILE_MODEL = "hostile-scripted"


# Page expectations wait this long (ms): the suite shares two cores with the model and other tests.
expect.set_options(timeout=20_000)


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(
            "Debian's chromium is not installed (make test installs it: scripts/ensure-system-packages.sh)"
        )
    with sync_playwright() as playwright:
        # launch() gives Chromium a fresh temporary profile directory of its own, removed on close.
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def oauth_provider() -> Iterator:
    provider = fake_oauth.FakeProvider()
    port = free_port()
    provider.url = f"http://127.0.0.1:{port}"
    with fake_oauth.ServerThread(provider.app(), port):
        yield provider


@pytest.fixture(scope="session")
def web_stack(
    cpu_backend: BackendProcess, oauth_provider, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    log_dir = tmp_path_factory.mktemp("web-stack")
    port = free_port()
    stack = start_stack(
        log_dir,
        cpu_backend.url,
        f"sqlite+aiosqlite:///{log_dir}/oasst.db",
        None,
        port=port,
        OASST_SERVER_API_ROOT=f"http://127.0.0.1:{port}",
        OASST_SERVER_AUTH_SECRET=AUTH_SECRET,
        OASST_SERVER_ADMIN_ROOT_TOKEN=ADMIN_ROOT_TOKEN,
        OASST_SERVER_RATE_LIMIT_PER_MINUTE=str(RATE_LIMIT_PER_MINUTE),
        OASST_SERVER_PENDING_UPDATE_INTERVAL="0.3",
        OASST_SERVER_AUTH_GITHUB_CLIENT_ID=fake_oauth.CLIENT_ID,
        OASST_SERVER_AUTH_GITHUB_CLIENT_SECRET=fake_oauth.CLIENT_SECRET,
        OASST_SERVER_AUTH_GITHUB_AUTHORIZE_URL=f"{oauth_provider.url}/github/login/oauth/authorize",
        OASST_SERVER_AUTH_GITHUB_TOKEN_URL=f"{oauth_provider.url}/github/login/oauth/access_token",
        OASST_SERVER_AUTH_GITHUB_API_BASE_URL=f"{oauth_provider.url}/github/api/",
    )
    yield stack
    stack.stop()


@pytest.fixture
def open_page(browser, web_stack) -> Iterator[Callable[..., WebPage]]:
    """Opens the chat page in a fresh browser context; every page must end clean (see PageWatch)."""
    opened: list[WebPage] = []

    def open_(
        viewport: dict[str, int] = DESKTOP, color_scheme: str = "light", base_url: str | None = None
    ) -> WebPage:
        context = browser.new_context(viewport=viewport, color_scheme=color_scheme, device_scale_factor=1)
        context.set_default_timeout(30_000)
        page = WebPage(context, base_url or web_stack.url)
        opened.append(page)
        return page

    yield open_
    for page in opened:
        page.close()
    for page in opened:
        page.watch.assert_clean()


@pytest.fixture
def hostile_model(web_stack: Stack, tmp_path: Path) -> Iterator[ManagedProcess]:
    """A second model whose scripted backend answers with attacks on the page; yields its worker
    (stop it to make the model vanish)."""
    port = free_port()
    argv = [sys.executable, "-m", "tests.web.hostile_backend", str(port)]
    backend = spawn("hostile-backend", argv, {}, tmp_path, cwd=ROOT)
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/health", backend, timeout=30)
        url = f"http://127.0.0.1:{port}"
        worker = start_fake_worker(web_stack, FakeBackend(url, backend), fake_model(HOSTILE_MODEL))
        yield worker
        worker.stop()
        web_stack.workers.remove(worker)
    finally:
        backend.stop()
