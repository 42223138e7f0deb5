"""OAuth sign-in through authlib against the fake GitHub/Discord provider on loopback."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from oasst_inference_server.auth import oauth
from tests.support.api import API, assert_error, get_with_cookies, provider_redirect, start_sign_in

pytestmark = API


@pytest.mark.parametrize(
    "provider, identity, expected_name",
    [
        ("github", {"id": 4242, "login": "octo-ada"}, "octo-ada"),
        ("discord", {"id": "80351110224678912", "username": "nelly"}, "nelly"),
    ],
)
async def test_sign_in_with_a_provider(client, fake_provider, provider, identity, expected_name):
    location, state, nonce = await start_sign_in(client, provider)
    query = parse_qs(urlsplit(location).query)
    assert query["redirect_uri"] == [f"http://testserver/auth/callback/{provider}"]
    assert query["client_id"] == ["fake-client-id"] and query["response_type"] == ["code"]
    fake_provider.next_identity = identity
    back, params = await provider_redirect(location)
    assert back.startswith(f"http://testserver/auth/callback/{provider}?") and params["state"] == state
    callback = await get_with_cookies(
        client, f"/auth/callback/{provider}", {oauth.STATE_COOKIE: nonce}, params=params
    )
    assert callback.status_code == 200, callback.text
    tokens = callback.json()
    headers = {"Authorization": f"Bearer {tokens['access_token']['access_token']}"}
    check = (await client.get("/auth/check", headers=headers)).json()
    assert check["display_name"] == expected_name
    account = (await client.get("/account", headers=headers)).json()
    assert account["provider"] == provider and account["provider_account_id"] == str(identity["id"])
    if provider == "discord":  # Discord refuses a token request without its grant type
        assert fake_provider.discord_grant_types[-1] == "authorization_code"
    # The refresh token works like any other.
    refreshed = await client.post(
        "/auth/refresh", json={"refresh_token": tokens["refresh_token"]["access_token"]}
    )
    assert refreshed.status_code == 200
    # Signing in again finds the same user.
    location, _, nonce = await start_sign_in(client, provider)
    _, params = await provider_redirect(location)
    again = await get_with_cookies(
        client, f"/auth/callback/{provider}", {oauth.STATE_COOKIE: nonce}, params=params
    )
    again_headers = {"Authorization": f"Bearer {again.json()['access_token']['access_token']}"}
    assert (await client.get("/auth/check", headers=again_headers)).json()["user_id"] == check["user_id"]


async def test_callback_refuses_a_foreign_or_broken_state(client, fake_provider):
    location, state, nonce = await start_sign_in(client, "github")
    _, params = await provider_redirect(location)
    cookies = {oauth.STATE_COOKIE: nonce}
    # Started in another browser (no cookie, or another sign-in's cookie).
    assert_error(await client.get("/auth/callback/github", params=params), 400, "oauth_state_mismatch")
    _, _, other_nonce = await start_sign_in(client, "github")
    assert_error(
        await get_with_cookies(
            client, "/auth/callback/github", {oauth.STATE_COOKIE: other_nonce}, params=params
        ),
        400,
        "oauth_state_mismatch",
    )
    # A tampered state, or one made for the other provider.
    bad = params | {"state": state[:-2] + "xx"}
    assert_error(
        await get_with_cookies(client, "/auth/callback/github", cookies, params=bad),
        400,
        "oauth_state_invalid",
    )
    assert_error(
        await get_with_cookies(client, "/auth/callback/discord", cookies, params=params),
        400,
        "oauth_state_invalid",
    )
    # Missing parameters.
    assert_error(
        await get_with_cookies(client, "/auth/callback/github", cookies, params={"state": state}), 422
    )


async def test_expired_state_is_refused(client, app, fake_provider):
    config = oauth.get_provider(app.state.settings, "github")
    expired = app.state.settings.model_copy(update={"oauth_state_ttl_seconds": -5})
    state, nonce = oauth.new_state(expired, config)
    response = await get_with_cookies(
        client, "/auth/callback/github", {oauth.STATE_COOKIE: nonce}, params={"code": "x", "state": state}
    )
    assert_error(response, 400, "oauth_state_expired")


@pytest.mark.parametrize("provider", ["github", "discord"])
async def test_a_code_is_good_once(client, fake_provider, provider):
    location, _, nonce = await start_sign_in(client, provider)
    _, params = await provider_redirect(location)
    cookies = {oauth.STATE_COOKIE: nonce}
    assert (
        await get_with_cookies(client, f"/auth/callback/{provider}", cookies, params=params)
    ).status_code == 200
    replay = await get_with_cookies(client, f"/auth/callback/{provider}", cookies, params=params)
    assert_error(replay, 400, "oauth_error")


async def test_wrong_client_secret_is_reported(client, app, fake_provider):
    location, _, nonce = await start_sign_in(client, "discord")
    _, params = await provider_redirect(location)
    original = app.state.settings
    app.state.settings = original.model_copy(update={"auth_discord_client_secret": "not-the-secret-000"})
    try:
        response = await get_with_cookies(
            client, "/auth/callback/discord", {oauth.STATE_COOKIE: nonce}, params=params
        )
        assert_error(response, 400, "oauth_error")
    finally:
        app.state.settings = original


async def test_unreachable_provider_is_a_502(client, app):
    from tests.support.processes import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    original = app.state.settings
    app.state.settings = original.model_copy(
        update={"auth_github_token_url": f"{dead}/token", "auth_github_api_base_url": f"{dead}/api/"}
    )
    try:
        config = oauth.get_provider(app.state.settings, "github")
        state, state_cookie_nonce = oauth.new_state(app.state.settings, config)
        response = await get_with_cookies(
            client,
            "/auth/callback/github",
            {oauth.STATE_COOKIE: state_cookie_nonce},
            params={"code": "c", "state": state},
        )
        assert_error(response, 502, "oauth_provider_error")
    finally:
        app.state.settings = original


async def test_unknown_or_unconfigured_provider_is_a_404(client, app):
    assert_error(await client.get("/auth/login/google"), 404, "unknown_provider")
    assert_error(
        await client.get("/auth/callback/google", params={"code": "c", "state": "s"}), 404, "unknown_provider"
    )
    original = app.state.settings
    app.state.settings = original.model_copy(update={"auth_github_client_id": None})
    try:
        assert_error(await client.get("/auth/login/github"), 404, "unknown_provider")
        assert "github" not in (await client.get("/auth/providers")).json()
    finally:
        app.state.settings = original
