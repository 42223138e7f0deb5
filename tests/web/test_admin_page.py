"""The web chat's admin page (/manage) in Chromium, against the running stack: an admin user sees the live
workers and queues as the admin API reports them; a normal user sees no Admin entry, and the admin data
is refused to their token by the server, whatever the page does. Data the page draws is text only."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator

import httpx
import pytest
from playwright.sync_api import Page, Route, expect

from tests.web.a11y import assert_accessible
from tests.web.conftest import ADMIN_ROOT_TOKEN
from tests.web.web_support import ServerView, WebPage, new_name

pytestmark = pytest.mark.slow

PAGE_DATA = ["/admin/fleet", "/admin/worker_sessions", "/admin/workers", "/admin/queues"]
# Routes other parts of the service add (keys with limits, moderation); a server without them answers 404.
OPTIONAL = ["/admin/keys", "/admin/moderation/flags"]

# Fetches each path with the page's own access token, as a script in the page could; returns the statuses.
DIRECT_FETCH = """async (paths) => {
  const token = JSON.parse(localStorage.getItem('oasst.session')).access;
  const statuses = [];
  for (const path of paths) {
    statuses.push((await fetch(path, { headers: { Authorization: `Bearer ${token}` } })).status);
  }
  return statuses;
}"""


@pytest.fixture
def root(web_stack) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=web_stack.url, headers={"Authorization": f"Bearer {ADMIN_ROOT_TOKEN}"}, timeout=30
    ) as client:
        yield client


def set_admin(root: httpx.Client, user_id: str, admin: bool) -> None:
    response = root.put(f"/admin/users/{user_id}/admin", json={"admin": admin})
    assert response.status_code == 200, response.text
    assert response.json()["is_admin"] is admin


def admin_signed_in(open_page, web_stack, root: httpx.Client) -> tuple[WebPage, ServerView]:
    name = new_name("admin")
    server = ServerView(web_stack.url, name)
    set_admin(root, server.get("/account")["id"], True)
    web = open_page()
    for path in OPTIONAL:
        web.watch.allow("status 404", path)
    web.sign_in(name)
    return web, server


def answer_with(body: object) -> Callable[[Route], None]:
    def handler(route: Route) -> None:
        route.fulfill(status=200, content_type="application/json", body=json.dumps(body))

    return handler


def open_admin(page: Page) -> None:
    expect(page.locator("#open-admin")).to_be_visible()
    page.click("#open-admin")
    expect(page).to_have_url(re.compile(r"/manage$"))
    expect(page.locator("#admin-view")).to_be_visible()
    expect(page.locator("#main")).to_be_hidden()
    expect(page.locator("#admin-view")).to_have_attribute("aria-busy", "false")


def test_an_admin_sees_the_live_workers_and_queues(open_page, web_stack, root):
    web, server = admin_signed_in(open_page, web_stack, root)
    page = web.page
    open_admin(page)

    fleet = root.get("/admin/fleet").json()
    sessions = {s["session_id"]: s for s in root.get("/admin/worker_sessions").json()}
    assert fleet["workers"], "the stack's worker is connected"
    expect(page.locator("#admin-workers tbody tr")).to_have_count(len(fleet["workers"]))
    for worker in fleet["workers"]:
        row = page.locator(f'#admin-workers tr[data-session-id="{worker["session_id"]}"]')
        expect(row).to_contain_text(worker["session_id"])
        expect(row).to_contain_text(worker["model_config_name"])
        trusted = sessions[worker["session_id"]]["trusted"]
        trust = {True: "trusted", False: "untrusted", None: "—"}[trusted]
        expect(row.locator("td").nth(3)).to_have_text(trust)
        slots = sessions[worker["session_id"]]["max_parallel_requests"]
        expect(row.locator("td").nth(4)).to_have_text(re.compile(rf"^\d+ / {slots}$"))
        for servable in worker["servable"]:
            expect(row.locator("td").nth(6)).to_contain_text(servable["name"])

    queues = root.get("/admin/queues").json()["models"]
    assert web_stack.model_name in [q["model_config_name"] for q in queues]
    expect(page.locator("#admin-queues tbody tr")).to_have_count(len(queues))
    for queue in queues:
        row = page.locator(f'#admin-queues tr[data-model="{queue["model_config_name"]}"]')
        expect(row.locator("td").nth(4)).to_have_text(str(len(queue["workers"])))

    # Keys and flagged messages: drawn when the server has their routes, "not available" when it does not.
    for path, section in zip(OPTIONAL, ["#admin-keys", "#admin-flags"], strict=True):
        if root.get(path).status_code == 404:
            expect(page.locator(section)).to_have_text("Not available on this server.")
        else:
            expect(page.locator(section).locator("table, p.muted")).to_be_visible()
    assert_accessible(page)
    web.screenshot("admin-page-desktop-light")

    # Refreshed on demand, and by itself while shown.
    with page.expect_response(lambda r: r.url.endswith("/admin/queues")):
        page.click("#admin-refresh")
    with page.expect_response(lambda r: r.url.endswith("/admin/fleet"), timeout=30_000):
        pass

    # Its address opens it again; "Back to chat" leaves it.
    page.reload()
    expect(page.locator("#admin-view")).to_be_visible()
    expect(page.locator("#admin-workers tbody tr")).to_have_count(len(fleet["workers"]))
    page.click("#admin-back")
    expect(page.locator("#main")).to_be_visible()
    expect(page.locator("#admin-view")).to_be_hidden()
    assert page.url == web_stack.url + "/"

    # No longer an admin: the server refuses the data at once, and the page says so.
    set_admin(root, server.get("/account")["id"], False)
    web.watch.allow("status 403", "/admin/")
    page.click("#open-admin")
    expect(page.locator("#admin-error")).to_contain_text("not an admin")
    expect(page.locator("#open-admin")).to_be_hidden()
    expect(page.locator("#admin-workers tr")).to_have_count(0)


def test_the_page_draws_keys_and_flagged_messages_as_text(open_page, web_stack, root):
    """The keys' and flags' shapes (docs/web-chat.md), as their routes answer them, with hostile text."""
    web, _ = admin_signed_in(open_page, web_stack, root)
    page = web.page
    attack = '<img src=x onerror="window.__pwned=1"><b>bold</b>'
    keys = [
        {
            "id": "k1",
            "user_id": "u1",
            "name": attack,
            "prefix": "oak-abc",
            "revoked_at": None,
            "limits": {
                "requests_per_minute": 30,
                "tokens_per_minute": None,
                "budget_tokens": 100000,
                "budget_usd": 2.5,
                "budget_period": "month",
                "allowed_models": ["m-a", "m-b"],
            },
            "usage": {"requests_today": 7, "tokens_today": 1234, "spent_usd_period": 0.125},
        },
        {
            "id": "k2",
            "user_id": "u2",
            "name": "old",
            "prefix": "oak-def",
            "revoked_at": "2026-01-02T03:04:05Z",
            "limits": {
                "requests_per_minute": None,
                "tokens_per_minute": None,
                "budget_tokens": None,
                "budget_usd": None,
                "budget_period": None,
                "allowed_models": None,
            },
            "usage": {"requests_today": 0, "tokens_today": 0, "spent_usd_period": 0.0},
        },
    ]
    flags = [
        {
            "id": "f1",
            "message_id": "m1",
            "chat_id": None,
            "user_id": "u1",
            "stage": "answer",
            "check": "wordlist",
            "action": "replace",
            "categories": ["violence", "<script>x</script>"],
            "excerpt": attack,
            "created_at": "2026-01-02T03:04:05Z",
        }
    ]
    for path, body in (("/admin/keys", keys), ("/admin/moderation/flags", flags)):
        page.route(f"**{path}", answer_with(body))
    open_admin(page)

    first = page.locator('#admin-keys tr[data-key-id="k1"] td')
    expect(first.nth(0)).to_have_text(attack)
    expect(first.nth(4)).to_have_text("30")
    expect(first.nth(5)).to_have_text("—")
    expect(first.nth(6)).to_have_text("100000 tokens or $2.50 a month")
    expect(first.nth(7)).to_have_text("m-a, m-b")
    expect(first.nth(8)).to_have_text("7")
    expect(first.nth(9)).to_have_text("1234")
    expect(first.nth(10)).to_have_text("$0.13")
    second = page.locator('#admin-keys tr[data-key-id="k2"] td')
    expect(second.nth(3)).to_contain_text("revoked")
    expect(second.nth(6)).to_have_text("—")
    expect(second.nth(7)).to_have_text("any")

    flag = page.locator('#admin-flags tr[data-flag-id="f1"] td')
    expect(flag.nth(1)).to_have_text("answer")
    expect(flag.nth(3)).to_have_text("replace")
    expect(flag.nth(4)).to_have_text("violence, <script>x</script>")
    expect(flag.nth(5)).to_have_text(attack)
    expect(flag.nth(6)).to_have_text("m1")
    # Text, not markup: no element came from the data, and nothing ran.
    assert page.locator("#admin-view img, #admin-view b, #admin-view script").count() == 0
    assert page.evaluate("() => window.__pwned") is None


def test_a_user_sees_no_admin_entry_and_the_admin_data_is_refused(open_page, web_stack):
    name = new_name()
    server = ServerView(web_stack.url, name)
    web = open_page()
    web.sign_in(name)
    page = web.page
    expect(page.locator("#open-admin")).to_be_hidden()

    # The page's address for it leads back to the chat.
    web.goto("/manage")
    expect(page.locator("#app")).to_be_visible()
    expect(page.locator("#main")).to_be_visible()
    expect(page.locator("#admin-view")).to_be_hidden()
    expect(page).to_have_url(re.compile(r"/$"))
    expect(page.locator("#open-admin")).to_be_hidden()

    # The server refuses the data to the user's token, asked from the page or from anywhere else.
    web.watch.allow("status 403", "/admin/")
    assert page.evaluate(DIRECT_FETCH, PAGE_DATA) == [403] * len(PAGE_DATA)
    for path in PAGE_DATA:
        refused = server.http.get(path)
        assert refused.status_code == 403 and refused.json()["code"] == "forbidden", refused.text
    assert server.get("/account")["is_admin"] is False
