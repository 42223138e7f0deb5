"""What the server adds for its web chat page: per-user settings, the OAuth hand-off to the page, the
page's files with their security headers, and the system prompt in message reads.

The page itself is tested in a real browser in tests/web/.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from oasst_inference_server.api.routes.web import CONTENT_SECURITY_POLICY
from oasst_inference_server.auth import oauth
from oasst_inference_server.chats.user_settings import MAX_SETTINGS_BYTES
from oasst_inference_server.db.models import DbUserSettings
from tests.support.api import (
    API,
    assert_error,
    get_with_cookies,
    provider_redirect,
    start_chat,
    start_sign_in,
)

pytestmark = API

STATIC_DIR = Path(__file__).resolve().parents[2] / "oasst_inference_server" / "static"
DEFAULT_SETTINGS = {
    "model_config_name": None,
    "preset": None,
    "custom_sampling_parameters": None,
    "theme": "system",
}


# ---------------------------------------------------------------- settings


async def test_settings_start_at_the_defaults_and_round_trip(client, user, other_user):
    assert (await client.get("/account/settings", headers=user.headers)).json() == DEFAULT_SETTINGS
    chosen = {
        "model_config_name": "SmolLM2-135M-Instruct",
        "preset": "custom",
        "custom_sampling_parameters": {"temperature": 0.3, "max_new_tokens": 64, "stop": ["\n\n"]},
        "theme": "dark",
        "an_unknown_field": "is ignored",
    }
    saved = await client.put("/account/settings", json=chosen, headers=user.headers)
    assert saved.status_code == 200, saved.text
    read = (await client.get("/account/settings", headers=user.headers)).json()
    assert read == saved.json()
    assert read["theme"] == "dark" and read["preset"] == "custom" and "an_unknown_field" not in read
    params = read["custom_sampling_parameters"]
    assert params["temperature"] == 0.3 and params["max_new_tokens"] == 64 and params["stop"] == ["\n\n"]
    # Settings are per user, and a PUT replaces them whole.
    assert (await client.get("/account/settings", headers=other_user.headers)).json() == DEFAULT_SETTINGS
    await client.put("/account/settings", json={"theme": "light"}, headers=user.headers)
    assert (await client.get("/account/settings", headers=user.headers)).json() == {
        **DEFAULT_SETTINGS,
        "theme": "light",
    }


@pytest.mark.parametrize(
    "body",
    [
        {"theme": "pink"},
        {"custom_sampling_parameters": {"temperature": -1}},
        {"custom_sampling_parameters": {"max_new_tokens": 0}},
        {"model_config_name": "m" * 129},
        {"preset": "p" * 65},
        [],
    ],
)
async def test_invalid_settings_are_a_422(client, user, body):
    assert_error(await client.put("/account/settings", json=body, headers=user.headers), 422)


async def test_settings_are_bounded_in_size(client, user):
    # Every field is bounded by the schema now (stop strings too: oasst_shared.limits), so oversized
    # settings are refused by validation before the stored-size check behind it.
    huge = {"custom_sampling_parameters": {"stop": ["x" * (MAX_SETTINGS_BYTES // 2)] * 3}}
    assert_error(
        await client.put("/account/settings", json=huge, headers=user.headers), 422, "validation_error"
    )
    assert (await client.get("/account/settings", headers=user.headers)).json() == DEFAULT_SETTINGS


async def test_settings_need_a_user_and_go_with_the_account(client, app, login):
    assert_error(await client.get("/account/settings"), 401)
    assert_error(await client.put("/account/settings", json={}), 401)
    leaving = await login()
    await client.put("/account/settings", json={"theme": "dark"}, headers=leaving.headers)
    assert (await client.delete("/account", headers=leaving.headers)).status_code == 204
    async with app.state.session_factory() as session:
        assert await session.get(DbUserSettings, leaving.id) is None


# ---------------------------------------------------------------- the OAuth hand-off to the page


def handoff_result(html: str) -> dict:
    match = re.search(r'<script type="application/json" id="signin-result">(.*?)</script>', html)
    assert match, html
    return json.loads(match.group(1))


async def start_web(client, provider: str = "github") -> tuple[str, str]:
    """GET /auth/login/{provider}?web=true; returns (the provider URL, the nonce cookie)."""
    response = await client.get(f"/auth/login/{provider}", params={"web": "true"})
    assert response.status_code == 302, response.text
    nonce = response.cookies.get(oauth.STATE_COOKIE)
    client.cookies.clear()
    return response.headers["location"], nonce


async def test_a_sign_in_started_by_the_page_ends_on_a_page_that_keeps_the_tokens(client, fake_provider):
    location, nonce = await start_web(client)
    fake_provider.next_identity = {"id": 8080, "login": "page-user"}
    _, params = await provider_redirect(location)
    response = await get_with_cookies(
        client, "/auth/callback/github", {oauth.STATE_COOKIE: nonce}, params=params
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert response.headers["cache-control"] == "no-store"
    assert '<script type="module" src="/static/js/signin-handoff.js">' in response.text
    result = handoff_result(response.text)
    assert result["error"] is None
    headers = {"Authorization": f"Bearer {result['tokens']['access_token']['access_token']}"}
    assert (await client.get("/auth/check", headers=headers)).json()["display_name"] == "page-user"
    refreshed = await client.post(
        "/auth/refresh", json={"refresh_token": result["tokens"]["refresh_token"]["access_token"]}
    )
    assert refreshed.status_code == 200
    # Without ?web=true the same flow still answers JSON (the text-client and other clients).
    location, _, nonce = await start_sign_in(client, "github")
    _, params = await provider_redirect(location)
    plain = await get_with_cookies(
        client, "/auth/callback/github", {oauth.STATE_COOKIE: nonce}, params=params
    )
    assert plain.headers["content-type"] == "application/json" and "access_token" in plain.json()


async def test_a_failed_page_sign_in_is_shown_on_the_page(client, fake_provider):
    location, nonce = await start_web(client, "discord")
    _, params = await provider_redirect(location)
    cookies = {oauth.STATE_COOKIE: nonce}
    assert (
        await get_with_cookies(client, "/auth/callback/discord", cookies, params=params)
    ).status_code == 200
    # The provider refuses a code used twice: the page shows why, and no tokens.
    replay = await get_with_cookies(client, "/auth/callback/discord", cookies, params=params)
    assert replay.status_code == 400 and replay.headers["content-type"].startswith("text/html")
    result = handoff_result(replay.text)
    assert result["tokens"] is None and "refused" in result["error"]
    # A state from another browser (no cookie) is refused the same way.
    location, _ = await start_web(client)
    _, params = await provider_redirect(location)
    foreign = await client.get("/auth/callback/github", params=params)
    assert foreign.status_code == 400
    assert "not started in this browser" in handoff_result(foreign.text)["error"]


async def test_the_hand_off_escapes_what_it_embeds():
    from oasst_inference_server.api.routes.web import signin_handoff

    response = signin_handoff(error="</script><script>alert(1)</script> & more")
    body = bytes(response.body).decode()
    assert "</script><script>" not in body and "\\u003c/script\\u003e" in body
    assert handoff_result(body)["error"] == "</script><script>alert(1)</script> & more"


# ---------------------------------------------------------------- the page's files


@pytest.mark.parametrize("path", ["/", "/c/3f0c7a52-5c1b-4a44-9c49-2d1f0e7a9b11", "/manage"])
async def test_the_page_is_served_with_a_content_security_policy(client, path):
    response = await client.get(path)
    assert response.status_code == 200
    assert response.text == (STATIC_DIR / "index.html").read_text()
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "script-src 'self';" in CONTENT_SECURITY_POLICY and "unsafe-inline" not in CONTENT_SECURITY_POLICY
    assert response.headers["x-content-type-options"] == "nosniff"


async def test_static_files_and_the_favicon(client):
    script = await client.get("/static/js/app.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert script.headers["cache-control"] == "no-cache" and script.headers.get("etag")
    icon = await client.get("/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
    assert icon.content == (STATIC_DIR / "favicon.svg").read_bytes()
    assert (await client.get("/static/nothing-here.js")).status_code == 404
    assert (await client.get("/static/%2e%2e/api/routes/web.py")).status_code == 404


async def test_every_module_the_page_imports_exists():
    """A missing module would only show as a broken page: check the import graph here too."""
    pending, seen = [STATIC_DIR / "js" / "app.js", STATIC_DIR / "js" / "signin-handoff.js"], set()
    while pending:
        module = pending.pop()
        if module in seen:
            continue
        seen.add(module)
        for target in re.findall(r'^import .*? from "(\.[^"]+)";', module.read_text(), re.MULTILINE):
            path = (module.parent / target).resolve()
            assert path.is_file(), f"{module.name} imports {target}, which does not exist"
            pending.append(path)
    assert len(seen) > 10


# ---------------------------------------------------------------- what the page reads from the API


async def test_messages_carry_their_system_prompt_and_events_are_not_stored(client, user, live_model):
    conv = await start_chat(client, user, "Hello")
    created = await client.post(
        f"/chats/{conv.chat_id}/assistant_message",
        json={"parent_id": conv.prompter_id, "model_config_name": live_model, "system_prompt": "Be brief."},
        headers=user.headers,
    )
    assert created.json()["system_prompt"] == "Be brief."
    chat = (await client.get(f"/chats/{conv.chat_id}", headers=user.headers)).json()
    assert [m["system_prompt"] for m in chat["messages"]] == [None, "Be brief."]
    answer_id = created.json()["id"]
    await client.post(f"/chats/{conv.chat_id}/messages/{answer_id}/cancel", headers=user.headers)
    events = await client.get(f"/chats/{conv.chat_id}/messages/{answer_id}/events", headers=user.headers)
    assert events.status_code == 200 and '"state":"cancelled"' in events.text
    assert events.headers["cache-control"] == "no-cache"
