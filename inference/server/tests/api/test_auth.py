"""Sign-in, access and refresh tokens, trusted frontends, and the production settings guard."""

from __future__ import annotations

import asyncio
import base64
import secrets
import uuid

import pytest
from pydantic import ValidationError

from oasst_inference_server.auth.signed_tokens import create_token
from oasst_inference_server.settings import Settings
from tests.support.api import API, DISCORD_TRUSTED_KEY, TRUSTED_KEY, assert_error, trusted_header

pytestmark = API


async def test_debug_login_keeps_the_original_response_shape(client):
    response = await client.get("/auth/callback/debug", params={"code": "shape-check"})
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"access_token", "refresh_token"}
    assert body["access_token"]["token_type"] == "bearer" and body["access_token"]["access_token"]
    assert body["refresh_token"]["token_type"] == "bearer" and body["refresh_token"]["access_token"]
    # The same name signs in as the same user.
    again = (await client.get("/auth/callback/debug", params={"code": "shape-check"})).json()
    check = [
        (
            await client.get(
                "/auth/check", headers={"Authorization": f"Bearer {b['access_token']['access_token']}"}
            )
        )
        for b in (body, again)
    ]
    assert check[0].json() == check[1].json() and check[0].json()["display_name"] == "shape-check"


async def test_debug_login_redirect_and_providers(client):
    redirect = await client.get("/auth/login/debug", params={"username": "redirected"})
    assert redirect.status_code == 307
    assert redirect.headers["location"] == "/auth/callback/debug?code=redirected"
    assert (await client.get("/auth/providers")).json() == ["discord", "github", "debug"]


async def test_debug_login_only_when_enabled(app, client):
    original = app.state.settings
    app.state.settings = original.model_copy(update={"allow_debug_auth": False})
    try:
        assert_error(
            await client.get("/auth/callback/debug", params={"code": "x"}), 403, "debug_auth_disabled"
        )
        assert_error(
            await client.get("/auth/login/debug", params={"username": "x"}), 403, "debug_auth_disabled"
        )
        assert "debug" not in (await client.get("/auth/providers")).json()
    finally:
        app.state.settings = original


async def test_check_needs_a_valid_access_token(client, user, settings):
    ok = await client.get("/auth/check", headers=user.headers)
    assert ok.status_code == 200 and ok.json() == {"user_id": user.id, "display_name": user.name}
    assert_error(await client.get("/auth/check"), 401, "not_authenticated")
    assert_error(
        await client.get("/auth/check", headers={"Authorization": "Bearer junk"}), 401, "invalid_token"
    )
    # A refresh token is not an access token.
    bearer_refresh = {"Authorization": f"Bearer {user.refresh_token}"}
    assert_error(await client.get("/auth/check", headers=bearer_refresh), 401, "invalid_token")
    expired = settings.model_copy(update={"access_token_expire_minutes": -1})
    token = create_token(expired, user.id, "access")
    assert_error(
        await client.get("/auth/check", headers={"Authorization": f"Bearer {token}"}), 401, "token_expired"
    )
    forged = create_token(
        settings.model_copy(update={"auth_secret": "another-secret-of-at-least-32-bytes"}), user.id, "access"
    )
    assert_error(
        await client.get("/auth/check", headers={"Authorization": f"Bearer {forged}"}), 401, "invalid_token"
    )


async def test_refresh_rotates_and_the_old_token_is_used_up(client, user):
    first = await client.post("/auth/refresh", json={"refresh_token": user.refresh_token})
    assert first.status_code == 200, first.text
    pair = first.json()
    new_refresh = pair["refresh_token"]["access_token"]
    assert new_refresh != user.refresh_token
    check = await client.get(
        "/auth/check", headers={"Authorization": f"Bearer {pair['access_token']['access_token']}"}
    )
    assert check.json()["user_id"] == user.id
    # The original server's header works too.
    second = await client.post("/auth/refresh", headers={"Refresh": new_refresh})
    assert second.status_code == 200
    newest = second.json()["refresh_token"]["access_token"]
    # Reusing a used token revokes the whole family, including the newest token.
    assert_error(
        await client.post("/auth/refresh", json={"refresh_token": new_refresh}), 401, "refresh_token_reused"
    )
    assert_error(
        await client.post("/auth/refresh", json={"refresh_token": newest}), 401, "refresh_token_revoked"
    )
    # Another login (another family) is unaffected.
    other = (await client.get("/auth/callback/debug", params={"code": user.name})).json()
    ok = await client.post("/auth/refresh", json={"refresh_token": other["refresh_token"]["access_token"]})
    assert ok.status_code == 200


async def test_concurrent_refreshes_of_one_token_let_one_win(client, login):
    user = await login()
    results = await asyncio.gather(
        *(client.post("/auth/refresh", json={"refresh_token": user.refresh_token}) for _ in range(4))
    )
    statuses = sorted(r.status_code for r in results)
    assert statuses.count(200) == 1 and statuses.count(401) == 3, [r.text for r in results]


async def test_refresh_failures(client, app, user):
    assert_error(
        await client.post("/auth/refresh", json={"refresh_token": "ort_unknown"}),
        401,
        "invalid_refresh_token",
    )
    assert_error(await client.post("/auth/refresh"), 422, "validation_error")
    assert_error(await client.post("/auth/refresh", json={"refresh_token": ""}), 422, "validation_error")
    # An expired refresh token.
    from sqlalchemy import update

    from oasst_inference_server.auth.refresh_tokens import hash_secret
    from oasst_inference_server.db.models import DbRefreshToken, utcnow

    async with app.state.session_factory() as session:
        await session.exec(
            update(DbRefreshToken)
            .where(DbRefreshToken.token_hash == hash_secret(user.refresh_token))
            .values(expires_at=utcnow())
        )
        await session.commit()
    assert_error(
        await client.post("/auth/refresh", json={"refresh_token": user.refresh_token}),
        401,
        "refresh_token_expired",
    )


async def test_refresh_tokens_are_stored_hashed(app, user):
    from sqlalchemy import select

    from oasst_inference_server.db.models import DbRefreshToken

    async with app.state.session_factory() as session:
        hashes = (
            (await session.exec(select(DbRefreshToken.token_hash).where(DbRefreshToken.user_id == user.id)))
            .scalars()
            .all()
        )
    assert hashes and user.refresh_token not in hashes and all(len(h) == 64 for h in hashes)


async def test_logout_revokes_the_family(client, user):
    response = await client.post("/auth/logout", json={"refresh_token": user.refresh_token})
    assert response.status_code == 204
    assert_error(
        await client.post("/auth/refresh", json={"refresh_token": user.refresh_token}),
        401,
        "refresh_token_revoked",
    )
    # Unknown tokens are ignored (nothing to reveal).
    assert (await client.post("/auth/logout", json={"refresh_token": "ort_nope"})).status_code == 204


# ---------------------------------------------------------------- trusted clients


async def test_trusted_client_signs_its_users_in(client):
    user_id = str(uuid.uuid4())
    headers = trusted_header(user_id, username="Ada", provider_account_id="web-ada")
    registered = await client.post("/auth/trusted", headers=headers)
    assert registered.status_code == 200, registered.text
    assert registered.json() | {"created_at": None} == {
        "id": user_id,
        "provider": "trusted:website",
        "provider_account_id": "web-ada",
        "display_name": "Ada",
        "created_at": None,
    }
    # The header alone authenticates every request of the chat API.
    check = await client.get("/auth/check", headers=headers)
    assert check.json() == {"user_id": user_id, "display_name": "Ada"}
    chat = await client.post("/chats", json={}, headers=headers)
    assert chat.status_code == 200
    listed = await client.get("/chats", headers=headers)
    assert [c["id"] for c in listed.json()["chats"]] == [chat.json()["id"]]
    # A renamed user keeps their id.
    renamed = await client.get(
        "/auth/check", headers=trusted_header(user_id, username="Ada L.", provider_account_id="web-ada")
    )
    assert renamed.json() == {"user_id": user_id, "display_name": "Ada L."}


async def test_trusted_client_user_is_created_on_first_request(client):
    headers = trusted_header()
    assert (await client.get("/chats", headers=headers)).status_code == 200


async def test_trusted_client_refusals(client, user):
    assert_error(
        await client.get("/chats", headers=trusted_header(api_key="wrong-key")), 401, "unauthorized_client"
    )
    assert_error(
        await client.post("/auth/trusted", headers=trusted_header(api_key="wrong-key")),
        401,
        "unauthorized_client",
    )
    assert_error(await client.post("/auth/trusted"), 401, "not_authenticated")
    for garbage in [
        "not base64!",
        base64.b64encode(b"not json").decode(),
        base64.b64encode(b'{"api_key": 1}').decode(),
    ]:
        assert_error(
            await client.get("/chats", headers={"TrustedClient": garbage}), 401, "invalid_trusted_client"
        )
    # A trusted client cannot act for a user it did not create (here: a debug login).
    assert_error(await client.get("/chats", headers=trusted_header(user.id)), 401, "unauthorized_client")
    # Nor for another frontend's user.
    user_id = str(uuid.uuid4())
    assert (
        await client.post("/auth/trusted", headers=trusted_header(user_id, client="discord"))
    ).status_code == 200
    assert_error(
        await client.get("/chats", headers=trusted_header(user_id, client="website")),
        401,
        "unauthorized_client",
    )
    # A key speaks only with the client name it is bound to: the website's key cannot claim to be
    # the discord bot (whose users it would otherwise reach), nor the bot's key the website.
    assert_error(
        await client.get("/chats", headers=trusted_header(user_id, client="discord", api_key=TRUSTED_KEY)),
        401,
        "unauthorized_client",
    )
    assert_error(
        await client.get("/chats", headers=trusted_header(client="website", api_key=DISCORD_TRUSTED_KEY)),
        401,
        "unauthorized_client",
    )
    # One client account cannot be claimed by a second user id.
    taken = trusted_header(provider_account_id="acct-shared")
    assert (await client.post("/auth/trusted", headers=taken)).status_code == 200
    assert_error(
        await client.post("/auth/trusted", headers=trusted_header(provider_account_id="acct-shared")),
        409,
        "account_conflict",
    )


async def test_trusted_header_format_is_the_original_one():
    """Base64 of JSON with exactly the fields the original web frontend sends."""
    import json

    raw = json.loads(base64.b64decode(trusted_header("u-1", username="n")["TrustedClient"]))
    assert set(raw) == {"api_key", "client", "user_id", "provider_account_id", "username"}
    assert raw["api_key"] == TRUSTED_KEY and raw["user_id"] == "u-1"


# ---------------------------------------------------------------- production settings


@pytest.mark.parametrize(
    "override, complaint",
    [
        ({"auth_secret": "dev-secret"}, "AUTH_SECRET"),
        ({"auth_secret": "dev-secret-for-local-development-only"}, "AUTH_SECRET"),  # the default
        ({"allow_debug_auth": True}, "ALLOW_DEBUG_AUTH"),
        ({"auth_secret": "x" * 40}, "AUTH_SECRET"),  # long, but not random
        ({"metrics_token": "short"}, "METRICS_TOKEN"),
        ({"cors_origins": ["*"]}, "CORS_ORIGINS"),
        ({"trusted_client_api_keys": ["website:" + "t" * 4]}, "TRUSTED_CLIENT_API_KEYS"),
        ({"worker_api_keys": ["dev-worker-key"]}, "WORKER_API_KEYS"),
        ({"trusted_worker_api_keys": ["short-key"]}, "TRUSTED_WORKER_API_KEYS"),
        ({"trusted_client_api_keys": ["change-me"]}, "TRUSTED_CLIENT_API_KEYS"),
        ({"admin_root_token": "short"}, "ADMIN_ROOT_TOKEN"),
        ({"auth_github_client_id": "id"}, "GITHUB_CLIENT_SECRET"),
        ({"auth_discord_client_id": "id", "auth_discord_client_secret": "changeme"}, "DISCORD_CLIENT_SECRET"),
    ],
)
async def test_production_refuses_placeholder_secrets(override, complaint):
    good = {
        "environment": "production",
        "auth_secret": secrets.token_hex(32),
        "allow_debug_auth": False,
        "worker_api_keys": [secrets.token_hex(20)],
        "trusted_client_api_keys": [secrets.token_hex(20), f"discord:{secrets.token_hex(20)}"],
        "admin_root_token": secrets.token_hex(32),
    }
    Settings(_env_file=None, **good)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match=complaint):
        Settings(_env_file=None, **{**good, **override})  # type: ignore[call-arg]
