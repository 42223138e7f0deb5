"""The web chat page in a real headless Chromium, against the real stack."""

from __future__ import annotations

import shutil

import pytest

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
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


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    if not shutil.which("chromium") and not shutil.which(CHROMIUM):
        pytest.fail(
            "Debian's chromium is not installed (make venv installs it: scripts/ensure-system-packages.sh)"
        )
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


def test_a_user_chats_in_the_browser(browser, embedded_stack, tmp_path):
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(embedded_stack.url + "/")
    page.wait_for_function("document.querySelectorAll('#model option').length > 0", timeout=30_000)
    assert page.locator("#model").input_value() == embedded_stack.model_name

    page.fill("#input", "Hello! What is your name?")
    page.keyboard.press("Enter")
    page.wait_for_function(
        "[...document.querySelectorAll('.status')].some(e => /tokens/.test(e.textContent))", timeout=120_000
    )
    bubbles = page.locator(".msg.assistant:not(.status)")
    first_answer = bubbles.nth(0).inner_text()
    assert first_answer.strip()
    assert page.locator(".msg.user").nth(0).inner_text() == "Hello! What is your name?"

    # A second turn continues the same chat (its parent is the first answer).
    page.fill("#input", "Thanks!")
    page.click("#send")
    page.wait_for_function(
        "[...document.querySelectorAll('.status')].filter(e => /tokens/.test(e.textContent)).length >= 2",
        timeout=120_000,
    )
    assert bubbles.nth(1).inner_text().strip()
    page.screenshot(path=str(tmp_path / "web-chat.png"))
    assert not errors, errors
