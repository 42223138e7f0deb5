"""The web chat page in a real headless Chromium, against the real server, worker and CPU model.

Each test signs a new user in (its own browser context), drives the page as a person would, and
checks what the page shows against what the server stored. Every page must end without console
errors, failed requests or error responses, except those a test provokes and declares.
"""

from __future__ import annotations

import re
import time
import uuid
from urllib.parse import urlsplit

import httpx
import jwt
import pytest
from playwright.sync_api import expect

from tests.support.clients import closing
from tests.support.processes import free_port
from tests.web.a11y import accessibility_problems, assert_accessible, focus_order
from tests.web.conftest import AUTH_SECRET, HOSTILE_MODEL, RATE_LIMIT_PER_MINUTE, fake_oauth
from tests.web.drop_proxy import DropProxy
from tests.web.web_support import ANSWER_TIMEOUT, DESKTOP, PHONE, ServerView, WebPage, new_name, wait_until

pytestmark = pytest.mark.slow

SHORT = {
    "preset": "custom",
    "custom_sampling_parameters": {"max_new_tokens": 48, "temperature": 0.7, "top_p": 0.95},
}
LONG_STORY = "Write a very long story about a dragon who learns to bake bread, in ten chapters."

# Records the text of the answer being written each time it changes (installed before sending).
WATCH_STREAMING = """() => {
  window.__streamed = [];
  new MutationObserver(() => {
    const body = document.querySelector('#thread .msg.assistant[aria-busy="true"] .msg-body');
    if (body) window.__streamed.push(body.textContent.length);
  }).observe(document.getElementById('thread'), {subtree: true, childList: true, characterData: true});
}"""


# What the page shows for a Markdown text, rendered by the page's own module.
RENDERED_TEXT = """async (text) => {
  const { renderInto } = await import('/static/js/markdown.js');
  const div = document.createElement('div');
  renderInto(div, text, { final: false });
  return div.textContent;
}"""
ServerThread = fake_oauth.ServerThread


def signed_in(
    open_page, web_stack, settings: dict | None = None, **page_options
) -> tuple[WebPage, ServerView]:
    name = new_name()
    server = ServerView(web_stack.url, name)
    if settings:
        server.use_settings(**settings)
    web = open_page(**page_options)
    web.sign_in(name)
    return web, server


def chat_requests(page) -> list[str]:
    """Records "METHOD path" of every request the page makes to /chats/{id}/... from now on."""
    seen: list[str] = []
    page.on(
        "request",
        lambda r: seen.append(f"{r.method} {urlsplit(r.url).path}") if "/chats/" in r.url else None,
    )
    return seen


def test_chat_streams_an_answer_and_a_reload_restores_it(open_page, web_stack):
    web, server = signed_in(open_page, web_stack, SHORT)
    page = web.page
    expect(page.locator("#model")).to_have_value(web_stack.model_name)
    page.evaluate(WATCH_STREAMING)
    requests = chat_requests(page)
    web.send("Hello! Who are you? Answer in two sentences.")
    expect(web.prompts.first.locator(".msg-body")).to_have_text(
        "Hello! Who are you? Answer in two sentences."
    )
    # While it is written the answer is busy, Stop replaces Send, and tokens arrive one after another.
    expect(page.locator("#stop")).to_be_visible()
    answer = web.wait_answered()
    expect(page.locator("#send")).to_be_visible()
    lengths = page.evaluate("() => window.__streamed")
    partial = sorted({n for n in lengths if n > 0})
    assert len(partial) >= 3, f"the answer did not arrive token by token: {lengths}"
    chat_id = web.chat_id()
    stored = server.chat(chat_id)
    prompt, reply = stored["messages"]
    assert reply["state"] == "complete" and reply["content"].strip()
    # The message went as one turn: one POST that created both messages and streamed the answer
    # (then the title is read back); no prompter_message, assistant_message or events request.
    assert requests == [f"POST /chats/{chat_id}/turns", f"GET /chats/{chat_id}"], requests
    assert reply["sampling_parameters"]["max_new_tokens"] == 48
    expect(answer.locator(".msg-status")).to_contain_text(f"{reply['generated_tokens']} tokens")
    shown = web.answer_text()
    # The sidebar lists the chat under its title; the header and the tab show it too.
    title = stored["title"]
    assert title == "Hello! Who are you? Answer in two sentences."
    expect(page.locator("#chat-list .chat-item[aria-current=page] a")).to_have_text(title)
    expect(page.locator("#chat-title")).to_have_text(title)
    # A reload reads everything back from the server.
    page.reload()
    expect(web.answers).to_have_count(1)
    assert web.chat_id() == chat_id
    assert web.answer_text() == shown
    expect(web.prompts.first.locator(".msg-body")).to_have_text(prompt["content"])
    expect(page.locator("#chat-title")).to_have_text(title)
    expect(page).to_have_title(re.compile(re.escape(title)))


def test_stop_regenerate_edit_and_switch_branches(open_page, web_stack):
    web, server = signed_in(
        open_page, web_stack, {**SHORT, "custom_sampling_parameters": {"max_new_tokens": 160}}
    )
    page = web.page
    requests = chat_requests(page)
    # Stop: the answer ends as cancelled, with the text written so far.
    web.send(LONG_STORY)
    first = web.answers.first
    expect(first.locator(".msg-body")).not_to_have_text("", timeout=ANSWER_TIMEOUT)
    page.click("#stop")
    web.wait_answered(0)
    expect(first.locator(".msg-status")).to_have_text("Stopped.")
    chat_id = web.chat_id()
    stopped = server.chat(chat_id)["messages"][1]
    assert stopped["state"] == "cancelled"
    # Regenerate: a sibling answer, shown as 2 / 2.
    first.get_by_role("button", name="Regenerate answer").click()
    expect(web.answers.first.locator(".sibling-nav")).to_contain_text("2 / 2")
    second = web.wait_answered(0)
    web.screenshot("branches-desktop-light")
    regenerated = server.chat(chat_id)["messages"][2]
    assert regenerated["parent_id"] == stopped["parent_id"] and regenerated["state"] == "complete"
    # Arrows move between the siblings.
    second.get_by_role("button", name="Previous answer").click()
    expect(web.answers.first.locator(".msg-status")).to_have_text("Stopped.")
    expect(web.answers.first.locator(".sibling-nav")).to_contain_text("1 / 2")
    web.answers.first.get_by_role("button", name="Next answer").click()
    expect(web.answers.first.locator(".sibling-nav")).to_contain_text("2 / 2")
    # Reply to the finished answer, then edit that reply: a sibling prompt with its own answer.
    web.send("Thanks! Now say goodbye.")
    web.wait_answered(1)
    web.prompts.nth(1).get_by_role("button", name="Edit message").click()
    editor = page.get_by_role("textbox", name="Edit your message")
    editor.fill("Thanks! Now say hello again.")
    page.get_by_role("button", name="Save and send").click()
    expect(web.prompts.nth(1).locator(".msg-body")).to_have_text("Thanks! Now say hello again.")
    expect(web.prompts.nth(1).locator(".sibling-nav")).to_contain_text("2 / 2")
    web.wait_answered(1)
    # Messages and the edited one went as turns; only the regenerated answer was asked for alone.
    posts = [r.rsplit("/", 1)[-1] for r in requests if r.startswith("POST")]
    assert sorted(posts) == ["assistant_message", "cancel", "turns", "turns", "turns"], requests
    # Back to the first version of the reply: its own answer comes with it.
    web.prompts.nth(1).get_by_role("button", name="Previous version of this message").click()
    expect(web.prompts.nth(1).locator(".msg-body")).to_have_text("Thanks! Now say goodbye.")
    branch_answer = web.answer_text(1)
    messages = {m["id"]: m for m in server.chat(chat_id)["messages"]}
    goodbye = next(m for m in messages.values() if m["content"] == "Thanks! Now say goodbye.")
    goodbye_answer = next(m for m in messages.values() if m["parent_id"] == goodbye["id"])
    # The branch shown is kept on the server: a reload comes back to it, arrows and all.
    wait_until(lambda: server.chat(chat_id)["active_thread_tail_message_id"] == goodbye_answer["id"])
    page.reload()
    expect(web.prompts).to_have_count(2)
    expect(web.prompts.nth(1).locator(".msg-body")).to_have_text("Thanks! Now say goodbye.")
    expect(web.prompts.nth(1).locator(".sibling-nav")).to_contain_text("1 / 2")
    expect(web.answers.first.locator(".sibling-nav")).to_contain_text("2 / 2")
    assert web.answer_text(1) == branch_answer


def test_votes_and_reports_are_kept(open_page, web_stack):
    web, server = signed_in(open_page, web_stack, SHORT)
    page = web.page
    web.send("Name three colours.")
    answer = web.wait_answered()
    answer.get_by_role("button", name="Good answer").click()
    expect(answer.get_by_role("button", name="Good answer")).to_have_attribute("aria-pressed", "true")
    answer.get_by_role("button", name="Report answer").click()
    dialog = page.get_by_role("dialog", name="Report this answer")
    dialog.get_by_label("Spam").check()
    dialog.get_by_label("Details (optional)").fill("just testing the report form")
    dialog.get_by_role("button", name="Send report").click()
    expect(answer.get_by_role("button", name="Reported")).to_be_disabled()
    chat_id = web.chat_id()
    reply = server.chat(chat_id)["messages"][1]
    assert reply["score"] == 1 and reply["reports"] == ["spam"]
    page.reload()
    answer = web.wait_answered()
    expect(answer.get_by_role("button", name="Good answer")).to_have_attribute("aria-pressed", "true")
    expect(answer.get_by_role("button", name="Reported")).to_be_disabled()
    # A second click takes the vote back.
    answer.get_by_role("button", name="Good answer").click()
    expect(answer.get_by_role("button", name="Good answer")).to_have_attribute("aria-pressed", "false")
    wait_until(lambda: server.chat(chat_id)["messages"][1]["score"] == 0, what="the vote to be cleared")
    # Editing the first message starts a new chat: a chat has one root, so it cannot have siblings.
    web.prompts.first.get_by_role("button", name="Edit message").click()
    page.get_by_role("textbox", name="Edit your message").fill("Name three animals.")
    page.get_by_role("button", name="Save as new chat").click()
    expect(page.locator("#chat-list .chat-item")).to_have_count(2)
    expect(page.locator("#chat-list .chat-item[aria-current=page] a")).to_have_text("Name three animals.")
    expect(web.prompts.first.locator(".msg-body")).to_have_text("Name three animals.")
    web.wait_answered()
    assert web.chat_id() != chat_id and len(server.chat(chat_id)["messages"]) == 2


def test_settings_model_presets_and_system_prompt_are_kept(open_page, web_stack):
    web, server = signed_in(open_page, web_stack)
    page = web.page
    # The live model list feeds the picker; the model's presets feed the settings.
    models = server.get("/configs/model_configs")
    expect(page.locator("#model option")).to_have_count(len(models))
    page.get_by_role("button", name="Chat settings").click()
    dialog = page.get_by_role("dialog", name="Chat settings")
    preset = dialog.get_by_label("Sampling")
    expect(preset).to_have_value(models[0]["parameter_configs"][0]["name"])
    expect(dialog.get_by_label("Temperature")).to_be_disabled()
    preset.select_option("custom")
    dialog.get_by_label("Temperature").fill("0.2")
    dialog.get_by_label("Max new tokens").fill("24")
    dialog.get_by_label("Seed").fill("7")
    dialog.get_by_label("System prompt for this chat").fill("You are a pirate. Answer like one.")
    dialog.get_by_label("Theme").select_option("dark")
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    dialog.get_by_role("button", name="Done").click()
    wait_until(lambda: server.get("/account/settings")["theme"] == "dark", what="the settings to be saved")
    stored = server.get("/account/settings")
    assert stored["preset"] == "custom"
    custom = stored["custom_sampling_parameters"]
    assert (custom["temperature"], custom["max_new_tokens"], custom["seed"]) == (0.2, 24, 7)
    web.send("Where is the treasure?")
    web.wait_answered()
    chat_id = web.chat_id()
    reply = server.chat(chat_id)["messages"][1]
    assert reply["system_prompt"] == "You are a pirate. Answer like one."
    params = reply["sampling_parameters"]
    assert (params["temperature"], params["max_new_tokens"], params["seed"]) == (0.2, 24, 7)
    # After a reload the settings come back from the server, the system prompt from the chat.
    page.reload()
    web.wait_answered()
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    page.get_by_role("button", name="Chat settings").click()
    expect(dialog.get_by_label("Sampling")).to_have_value("custom")
    expect(dialog.get_by_label("Max new tokens")).to_have_value("24")
    expect(dialog.get_by_label("System prompt for this chat")).to_have_value(
        "You are a pirate. Answer like one."
    )
    dialog.get_by_label("Theme").select_option("light")
    dialog.get_by_role("button", name="Done").click()
    expect(page.locator("html")).to_have_attribute("data-theme", "light")
    # A new chat starts without the other chat's system prompt.
    page.get_by_role("button", name="New chat").click()
    page.get_by_role("button", name="Chat settings").click()
    expect(dialog.get_by_label("System prompt for this chat")).to_have_value("")
    dialog.get_by_role("button", name="Done").click()


def test_chat_list_pages_renames_hides_and_deletes(open_page, web_stack):
    name = new_name()
    server = ServerView(web_stack.url, name)
    ids = [server.call("POST", "/chats", {"title": f"Chat number {i:02d}"}).json()["id"] for i in range(25)]
    web = open_page()
    web.sign_in(name)
    page = web.page
    items = page.locator("#chat-list .chat-item")
    # Newest first, a page at a time.
    expect(items).to_have_count(20)
    expect(items.first.locator("a")).to_have_text("Chat number 24")
    page.get_by_role("button", name="Show older chats").click()
    expect(items).to_have_count(25)
    expect(items.last.locator("a")).to_have_text("Chat number 00")
    expect(page.get_by_role("button", name="Show older chats")).to_be_hidden()
    # Rename in place.
    page.get_by_role("button", name="Rename: Chat number 24").click()
    title = page.get_by_role("textbox", name="Chat title")
    title.fill("Holiday plans")
    title.press("Enter")
    expect(items.first.locator("a")).to_have_text("Holiday plans")
    assert server.chat(ids[24])["title"] == "Holiday plans"
    # Open a chat by its link; hide it: it leaves the list (and the page goes to a new chat).
    items.first.locator("a").click()
    expect(page).to_have_url(re.compile(f"/c/{ids[24]}$"))
    expect(page.locator("#chat-title")).to_have_text("Holiday plans")
    page.get_by_role("button", name="Hide: Holiday plans").click()
    expect(items).to_have_count(24)
    expect(page.locator("#chat-title")).to_have_text("New chat")
    assert server.chat(ids[24])["hidden"] is True
    # Hidden chats show on request, marked, and can come back.
    page.get_by_label("Show hidden chats").check()
    expect(items.first).to_contain_text("Holiday plans(hidden)")
    page.get_by_role("button", name="Unhide: Holiday plans").click()
    expect(items.first).not_to_contain_text("(hidden)")
    assert server.chat(ids[24])["hidden"] is False
    page.get_by_label("Show hidden chats").uncheck()
    # Delete asks first; Cancel keeps the chat.
    page.get_by_role("button", name="Delete: Chat number 23").click()
    page.get_by_role("dialog").get_by_role("button", name="Cancel").click()
    expect(items.nth(1).locator("a")).to_have_text("Chat number 23")
    page.get_by_role("button", name="Delete: Chat number 23").click()
    page.get_by_role("dialog").get_by_role("button", name="Delete").click()
    expect(items.nth(1).locator("a")).to_have_text("Chat number 22")
    assert server.call("GET", f"/chats/{ids[23]}").status_code == 404
    # Hide all.
    page.get_by_role("button", name="Hide all chats").click()
    page.get_by_role("dialog").get_by_role("button", name="Hide all").click()
    expect(items).to_have_count(0)
    expect(page.locator("#chat-list-empty")).to_be_visible()
    assert server.get("/chats")["chats"] == []


def forged_access_token(user_id: str, expires_in: int, secret: str = AUTH_SECRET) -> str:
    now = int(time.time())
    claims = {
        "sub": user_id,
        "kind": "access",
        "iat": now - 60,
        "exp": now + expires_in,
        "jti": uuid.uuid4().hex,
    }
    return jwt.encode(claims, secret, algorithm="HS256")


def set_access_token(web: WebPage, token: str) -> None:
    """Swap the stored access token, once the page's own requests are over: a request started after the
    swap would refresh with the stored refresh token, and the reload that follows could cut that refresh
    off after the server rotated the token (the new page would present the used one: reuse, signed out)."""
    web.page.wait_for_load_state("networkidle")
    web.page.evaluate(
        """(token) => {
          const tokens = JSON.parse(localStorage.getItem('oasst.session'));
          localStorage.setItem('oasst.session', JSON.stringify({...tokens, access: token}));
        }""",
        token,
    )


def test_oauth_sign_in_token_rotation_expiry_and_sign_out(open_page, web_stack, oauth_provider):
    web = open_page()
    page = web.page
    web.goto()
    login = new_name("octo")
    oauth_provider.next_identity = {"id": int(uuid.uuid4().int % 10**9), "login": login}
    expect(
        page.get_by_role("button", name="Sign in")
    ).to_be_visible()  # the development sign-in is offered here
    web.screenshot("signin-providers-desktop-light")
    page.get_by_role("link", name="Continue with GitHub").click()
    expect(page.locator("#account-name")).to_have_text(login)
    expect(page).to_have_url(web_stack.url + "/")
    tokens = web.tokens()
    http = closing(httpx.Client(base_url=web_stack.url))
    user_id = http.get("/auth/check", headers={"Authorization": f"Bearer {tokens['access']}"}).json()[
        "user_id"
    ]
    assert (
        http.get("/account", headers={"Authorization": f"Bearer {tokens['access']}"}).json()["provider"]
        == "github"
    )

    # An access token about to expire is refreshed before use: new tokens, no failed request.
    set_access_token(web, forged_access_token(user_id, expires_in=-5))
    page.reload()
    expect(page.locator("#account-name")).to_have_text(login)
    rotated = web.tokens()
    assert rotated["refresh"] != tokens["refresh"] and rotated["access"] != tokens["access"]

    # An access token the server refuses (here: signed with another key) is refreshed and retried.
    web.watch.allow("status 401", "/account")
    set_access_token(
        web, forged_access_token(user_id, expires_in=600, secret="another-secret-0123456789abcdefgh")
    )
    page.reload()
    expect(page.locator("#account-name")).to_have_text(login)
    assert web.tokens()["refresh"] != rotated["refresh"]

    # Signed out elsewhere (the refresh token's family revoked): a clear screen, not a broken page.
    web.watch.allow("status 401", "/auth/refresh")
    http.post("/auth/logout", json={"refresh_token": web.tokens()["refresh"]}).raise_for_status()
    set_access_token(web, forged_access_token(user_id, expires_in=-5))
    page.reload()
    expect(page.locator("#signin-notice")).to_have_text("Your session has expired. Sign in again.")
    web.screenshot("session-expired-desktop-light")
    expect(page.get_by_role("link", name="Continue with GitHub")).to_be_visible()
    assert web.tokens() is None

    # Sign out revokes the sign-in on the server too.
    name = new_name()
    page.fill("#dev-username", name)
    page.click("#dev-signin button[type=submit]")
    expect(page.locator("#account-name")).to_have_text(name)
    refresh_token = web.tokens()["refresh"]
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("link", name="Continue with GitHub")).to_be_visible()
    assert web.tokens() is None
    assert http.post("/auth/refresh", json={"refresh_token": refresh_token}).status_code == 401
    http.close()


def test_a_dropped_connection_resumes_without_duplicated_text(open_page, web_stack):
    proxy = DropProxy(web_stack.url)
    port = free_port()
    proxy.url = f"http://127.0.0.1:{port}"
    with ServerThread(proxy.app(), port):
        web, server = signed_in(
            open_page,
            web_stack,
            {**SHORT, "custom_sampling_parameters": {"max_new_tokens": 120}},
            base_url=proxy.url,
        )
        page = web.page
        web.send("Write a long story about a lighthouse keeper and a storm.")
        # The first tokens arrive, then the connection drops mid-answer.
        wait_until(proxy.holding.is_set, timeout=ANSWER_TIMEOUT / 1000, what="the first tokens")
        answer = web.answers.first
        expect(answer.locator(".msg-body")).not_to_have_text("")
        before = web.answer_text()
        web.watch.allow("failed", "/turns")
        proxy.cut()
        expect(answer.locator(".msg-status")).to_have_text("Connection lost. Reconnecting…")
        web.screenshot("reconnecting-desktop-light")
        # The page comes back with Last-Event-ID and gets only what it missed. The final event is
        # held back, so what is on screen now was streamed, not corrected by the final message.
        wait_until(proxy.holding_terminal.is_set, timeout=ANSWER_TIMEOUT / 1000, what="the resumed stream")
        # The answer streamed in the turn's own response; the page resumed it from the answer's events,
        # with the id of the answer from the turn's `created` event.
        first, resumed = proxy.requests
        chat_id = web.chat_id()
        reply = server.chat(chat_id)["messages"][1]
        assert (first.method, first.path) == ("POST", f"/chats/{chat_id}/turns")
        assert (resumed.method, resumed.path) == ("GET", f"/chats/{chat_id}/messages/{reply['id']}/events")
        assert first.last_event_id is None and resumed.last_event_id == first.relayed_ids[-1]
        assert len(first.relayed_ids) == 3 and not set(first.relayed_ids) & set(resumed.relayed_ids)
        assert reply["state"] == "complete"
        expected = page.evaluate(RENDERED_TEXT, reply["content"])
        expect(answer.locator(".msg-body")).to_have_text(expected)
        assert expected.startswith(before.rstrip()[:10]) and len(expected) > len(before)
        proxy.release()
        web.wait_answered()
        expect(answer.locator(".msg-status")).to_contain_text(f"{reply['generated_tokens']} tokens")
        expect(answer.locator(".msg-body")).to_have_text(expected)
        assert web.watch.seen("failed", "/turns") == 1 and web.watch.seen("failed", "/events") == 0


def test_a_rate_limit_is_explained_with_its_wait(open_page, web_stack):
    name = new_name()
    server = ServerView(web_stack.url, name)
    chat_id = server.call("POST", "/chats", {}).json()["id"]
    prompt_id = server.call("POST", f"/chats/{chat_id}/prompter_message", {"content": "Hi"}).json()["id"]
    for _ in range(RATE_LIMIT_PER_MINUTE):
        body = {
            "parent_id": prompt_id,
            "model_config_name": web_stack.model_name,
            "sampling_parameters": {"max_new_tokens": 1},
        }
        answer = server.call("POST", f"/chats/{chat_id}/assistant_message", body)
        assert answer.status_code == 200, answer.text
        server.call("POST", f"/chats/{chat_id}/messages/{answer.json()['id']}/cancel")
    web = open_page()
    web.sign_in(name)
    web.watch.allow("status 429", "/turns")
    web.send("One more, please.")
    error = web.page.locator("#thread .answer-error").get_by_role("alert")
    expect(error).to_have_text(
        re.compile(r"^You have reached the limit of answers per minute\. Try again in \d+ s\.$")
    )
    wait = int(re.search(r"in (\d+) s", error.inner_text()).group(1))
    assert 0 < wait <= 60
    expect(web.page.locator("#thread .answer-error").get_by_role("button", name="Try again")).to_be_visible()
    # The prompt is shown with why; the composer is free for the next message.
    expect(web.prompts).to_have_count(1)
    expect(web.prompts.last.locator(".msg-body")).to_have_text("One more, please.")
    expect(web.page.locator("#send")).to_be_enabled()
    web.screenshot("rate-limit-desktop-light")
    # The turn was refused whole: the prompt is not stored, so a reload shows an empty chat.
    new_chat = web.chat_id()
    assert new_chat != chat_id and server.chat(new_chat)["messages"] == []
    web.page.reload()
    expect(web.page.locator("#empty-chat")).to_be_visible()
    expect(web.prompts).to_have_count(0)
    expect(web.page.locator("#thread .answer-error")).to_have_count(0)


def set_system_prompt(page, text: str) -> None:
    page.get_by_role("button", name="Chat settings").click()
    dialog = page.get_by_role("dialog", name="Chat settings")
    dialog.get_by_label("System prompt for this chat").fill(text)
    dialog.get_by_role("button", name="Done").click()


def test_a_refused_turn_stores_nothing_and_try_again_sends_it_in_its_place(open_page, web_stack):
    web, server = signed_in(open_page, web_stack, SHORT)
    page = web.page
    requests = chat_requests(page)
    # A system prompt over the server's limit: the answer is refused, and with it the whole turn.
    set_system_prompt(page, "Answer in one short sentence. " * 300)
    web.watch.allow("status 422", "/turns")
    web.send("What is the capital of France?")
    answer_error = page.locator("#thread .answer-error")
    expect(answer_error.get_by_role("alert")).to_have_text(
        re.compile(r"^the system prompt has \d+ characters; this server accepts \d+$")
    )
    expect(web.prompts).to_have_count(1)
    expect(web.prompts.first.locator(".msg-body")).to_have_text("What is the capital of France?")
    chat_id = web.chat_id()
    assert server.chat(chat_id)["messages"] == []
    # Try again, with a shorter system prompt: the same prompt goes again, in its place.
    set_system_prompt(page, "Answer in one short sentence.")
    answer_error.get_by_role("button", name="Try again").click()
    web.wait_answered()
    expect(answer_error).to_have_count(0)
    expect(web.prompts).to_have_count(1)
    prompt, reply = server.chat(chat_id)["messages"]
    assert prompt["content"] == "What is the capital of France?" and reply["parent_id"] == prompt["id"]
    assert reply["state"] == "complete" and reply["system_prompt"] == "Answer in one short sentence."
    assert requests.count(f"POST /chats/{chat_id}/turns") == 2, requests
    assert not [r for r in requests if r.endswith(("/prompter_message", "/assistant_message"))], requests
    page.reload()
    web.wait_answered()
    expect(web.prompts).to_have_count(1)
    expect(web.answers).to_have_count(1)


def test_an_attack_in_an_answer_or_a_title_stays_inert(open_page, web_stack, hostile_model):
    title_attack = '<img src="/pwned-title.png" onerror="window.__pwned=2"><script>window.__pwned=1</script>'
    web, server = signed_in(open_page, web_stack, {"model_config_name": HOSTILE_MODEL})
    page = web.page
    expect(page.locator("#model")).to_have_value(HOSTILE_MODEL)
    web.send(title_attack)
    answer = web.wait_answered()
    body = answer.locator(".msg-body")
    # The Markdown is rendered...
    expect(body.locator("strong")).to_have_text("bold")
    expect(body.locator("a", has_text="safe link")).to_have_attribute("rel", "noopener noreferrer nofollow")
    expect(body.locator(".code-block pre code.hljs")).to_contain_text(
        '<script>alert("this one is only code")</script>'
    )
    web.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=web_stack.url)
    body.get_by_role("button", name="Copy code").click()
    expect(body.get_by_role("button", name="Copy code")).to_have_text("Copied")
    assert (
        page.evaluate("() => navigator.clipboard.readText()")
        == '<script>alert("this one is only code")</script>\n'
    )
    answer.get_by_role("button", name="Copy answer").click()
    expect(page.locator("#toasts")).to_contain_text("Answer copied.")
    assert (
        page.evaluate("() => navigator.clipboard.readText()")
        == server.chat(web.chat_id())["messages"][1]["content"]
    )
    expect(body.locator("code").first).to_have_text("<b>inline code</b>")
    # HTML the model wrote is shown as the text it is.
    expect(body).to_contain_text('<script>window.__pwned = "script"</script>')
    expect(body).to_contain_text("<style>body { display: none !important; }</style>")
    # ...and nothing of the attack is live: no active elements, handlers, styles or script links.
    live = page.evaluate(
        """() => {
          const body = document.querySelector('#thread .msg.assistant .msg-body');
          const all = [...body.querySelectorAll('*')];
          return {
            tags: all.map((el) => el.tagName.toLowerCase())
                     .filter((t) => ['script', 'img', 'iframe', 'svg', 'style', 'form', 'object', 'embed', 'button:not(copy)'].includes(t)),
            handlers: all.flatMap((el) => [...el.attributes].map((a) => a.name)).filter((n) => n.startsWith('on') || n === 'style' || n === 'id'),
            badLinks: [...body.querySelectorAll('a')].map((a) => a.getAttribute('href') || '').filter((h) => h && !/^https?:/.test(h)),
            classes: all.flatMap((el) => [...el.classList]).filter((c) => !/^(language-|hljs|code-|ghost$)|^[a-z]+_$/.test(c)),
            pwned: window.__pwned ?? null,
            bodyShown: getComputedStyle(document.body).display !== 'none',
          };
        }"""
    )
    assert live == {
        "tags": [],
        "handlers": [],
        "badLinks": [],
        "classes": [],
        "pwned": None,
        "bodyShown": True,
    }, live
    expect(body.get_by_text("[image: tracking pixel]")).to_have_attribute(
        "href", "http://127.0.0.1:9/pwned-pixel.png"
    )
    expect(page.locator("#send")).to_have_count(1)  # the spoofed id="send" did not survive
    # The title (the first prompt) is shown as text, in the sidebar, the header and the tab.
    title = server.chat(web.chat_id())["title"]
    expect(page.locator("#chat-list .chat-item a").first).to_have_text(title)
    expect(page.locator("#chat-title")).to_have_text(title)
    assert page.title().startswith(title)
    # A title renamed to an attack, after a reload too.
    page.get_by_role("button", name=f"Rename: {title}").click()
    renamed = "<script>window.__pwned='rename'</script><b onmouseover=alert(1)>bold?</b>"
    page.get_by_role("textbox", name="Chat title").fill(renamed)
    page.get_by_role("textbox", name="Chat title").press("Enter")
    expect(page.locator("#chat-list .chat-item a").first).to_have_text(renamed)
    page.reload()
    expect(page.locator("#chat-title")).to_have_text(renamed)
    expect(page.locator("#chat-list .chat-item a").first).to_have_text(renamed)
    web.wait_answered()
    assert page.evaluate("() => window.__pwned ?? null") is None
    assert page.locator("#chat-list b, #chat-title b, #chat-list script").count() == 0
    # When the model's worker goes away, asking it again says so, and the picker moves on.
    hostile_model.stop()
    web.watch.allow("status 400", "/turns")
    web.send("Are you still there?")
    expect(web.page.locator("#thread .answer-error").get_by_role("alert")).to_have_text(
        f"{HOSTILE_MODEL} is not available any more. Pick another model."
    )
    expect(web.prompts.last.locator(".msg-body")).to_have_text("Are you still there?")
    expect(page.locator("#model")).to_have_value(web_stack.model_name)
    # Nothing of the refused turn was stored: no prompt without an answer after a reload.
    assert len(server.chat(web.chat_id())["messages"]) == 2
    page.reload()
    web.wait_answered()
    expect(web.prompts).to_have_count(1)


def assert_checks_find_problems(page) -> None:
    """The checks below must be able to fail: a pale text and a nameless button are caught."""
    page.evaluate(
        """() => {
          const pale = document.createElement('p');
          pale.textContent = 'hard to read';
          pale.style.color = '#c8c8c8';
          const nameless = document.createElement('button');
          document.body.append(pale, nameless);
        }"""
    )
    problems = accessibility_problems(page)
    assert len(problems["lowContrast"]) == 1 and "hard to read" in problems["lowContrast"][0], problems
    assert len(problems["unnamed"]) == 1, problems
    page.reload()


def test_it_is_accessible_and_looks_right_on_a_desktop_and_a_phone(open_page, web_stack):
    name = new_name()
    server = ServerView(web_stack.url, name)
    server.use_settings(preset="custom", custom_sampling_parameters={"max_new_tokens": 240, "temperature": 0})
    web = open_page()
    web.goto()
    assert_checks_find_problems(web.page)
    assert_accessible(web.page)
    web.screenshot("signin-desktop-light")
    web.sign_in(name)
    web.send("Write a Python function that checks whether a number is prime. Use a code block.")
    web.wait_answered()
    chat_id = web.chat_id()
    for viewport, label in ((DESKTOP, "desktop"), (PHONE, "phone")):
        for scheme in ("light", "dark"):
            view = open_page(viewport=viewport, color_scheme=scheme)
            view.sign_in(name)
            view.goto(f"/c/{chat_id}")
            view.wait_answered()
            expect(view.page.locator("html")).to_have_attribute("data-theme", scheme)
            assert_accessible(view.page)
            view.screenshot(f"chat-{label}-{scheme}")
            order = focus_order(view.page, 8)
            if label == "phone":
                # The drawer is closed: the first stop is its button, the chats are not reachable.
                assert order[0] == "Show chats" and "New chat" not in order, order
                view.page.get_by_role("button", name="Show chats").click()
                expect(view.page.get_by_role("button", name="New chat")).to_be_focused()
                assert_accessible(view.page)
                view.screenshot(f"sidebar-{label}-{scheme}")
                view.page.keyboard.press("Escape")
                expect(view.page.get_by_role("button", name="Show chats")).to_be_focused()
            else:
                assert order[:2] == ["New chat", order[1]] and order[1].startswith(
                    "Write a Python function"
                ), order
            if scheme == "dark" and label == "desktop":
                view.page.get_by_role("button", name="Chat settings").click()
                assert_accessible(view.page)
                view.screenshot("settings-desktop-dark")
                view.page.keyboard.press("Escape")


def test_offline_sending_keeps_the_message_and_says_why(open_page, web_stack):
    web, _ = signed_in(open_page, web_stack, SHORT)
    page = web.page
    web.context.set_offline(True)
    web.watch.allow("failed", "/chats")
    web.send("Is anyone there?")
    expect(page.locator("#banner")).to_have_text(
        "Can't reach the server. Check your connection and try again."
    )
    expect(page.locator("#input")).to_have_value("Is anyone there?")
    expect(web.prompts).to_have_count(0)
    web.context.set_offline(False)
    page.press("#input", "Enter")
    web.wait_answered()
    expect(page.locator("#banner")).to_be_hidden()
