"""Admin users: a user's access token opens the admin API when the user is flagged an admin (by the admin
API or the admin CLI) or listed in ``settings.admin_users``; every other user's token is refused (403),
and taking the flag away ends the access at once."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import FastAPI

from oasst_inference_server.auth.signed_tokens import create_token
from tests.support.admin_cli import admin_cli
from tests.support.api import ADMIN, API, User, assert_error

pytestmark = API

# What the web chat's admin page reads.
PAGE_DATA = ["/admin/workers", "/admin/worker_sessions", "/admin/fleet", "/admin/queues"]


async def make_admin(
    client, user: User, admin: bool = True, headers: dict[str, str] = ADMIN
) -> dict[str, Any]:
    response = await client.put(f"/admin/users/{user.id}/admin", json={"admin": admin}, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


@contextmanager
def settings_changed(app: FastAPI, **changes: Any) -> Iterator[None]:
    original = app.state.settings
    app.state.settings = original.model_copy(update=changes)
    try:
        yield
    finally:
        app.state.settings = original


async def test_a_normal_users_token_is_refused_and_the_account_says_so(client, user):
    assert (await client.get("/account", headers=user.headers)).json()["is_admin"] is False
    for path in PAGE_DATA:
        assert_error(await client.get(path, headers=user.headers), 403, "forbidden")
    assert_error(
        await client.put(f"/admin/users/{user.id}/admin", json={"admin": True}, headers=user.headers),
        403,
        "forbidden",
    )
    # The refused call changed nothing.
    assert (await client.get(f"/admin/users/{user.id}", headers=ADMIN)).json()["is_admin"] is False


async def test_an_admin_users_token_opens_the_admin_api_until_the_flag_is_taken_away(
    client, user, other_user
):
    shown = await make_admin(client, user)
    assert shown["id"] == user.id and shown["is_admin"] is True
    assert (await client.get("/account", headers=user.headers)).json()["is_admin"] is True
    for path in PAGE_DATA:
        response = await client.get(path, headers=user.headers)
        assert response.status_code == 200, (path, response.text)
    # The same answers as the root token's.
    as_user = (await client.get("/admin/workers", headers=user.headers)).json()
    assert as_user == (await client.get("/admin/workers", headers=ADMIN)).json()

    # An admin user may make another one; the other user's own token is still refused until then.
    assert_error(await client.get("/admin/workers", headers=other_user.headers), 403, "forbidden")
    assert (await make_admin(client, other_user, headers=user.headers))["is_admin"] is True
    assert (await client.get("/admin/workers", headers=other_user.headers)).status_code == 200

    # Taken away: refused at once, although this process's user cache has just seen the user as an admin.
    assert (await make_admin(client, user, admin=False, headers=other_user.headers))["is_admin"] is False
    assert_error(await client.get("/admin/workers", headers=user.headers), 403, "forbidden")
    assert (await client.get("/account", headers=user.headers)).json()["is_admin"] is False


async def test_an_admin_users_revoked_or_forged_token_is_not_an_admin_token(client, app, login):
    admin = await login()
    await make_admin(client, admin)
    forged = create_token(app.state.settings.model_copy(update={"auth_secret": "x" * 40}), admin.id, "access")
    assert_error(await client.get("/admin/workers", headers={"Authorization": f"Bearer {forged}"}), 401)
    refresh = create_token(app.state.settings, admin.id, "refresh")
    assert_error(await client.get("/admin/workers", headers={"Authorization": f"Bearer {refresh}"}), 401)
    # An API key of an admin user is not a sign-in: refused.
    created = await client.post("/api_keys", json={"name": "admin's key"}, headers=admin.headers)
    assert created.status_code == 201, created.text
    key_headers = {"Authorization": f"Bearer {created.json()['key']}"}
    assert_error(await client.get("/admin/workers", headers=key_headers), 403, "forbidden")

    revoked = await client.post(f"/admin/users/{admin.id}/revoke_tokens", headers=ADMIN)
    assert revoked.status_code == 200
    assert_error(await client.get("/admin/workers", headers=admin.headers), 401, "token_revoked")


async def test_settings_admin_users_lists_admins_by_sign_in_identity(client, app, user, other_user):
    with settings_changed(app, admin_users=[f"debug:{user.name}"]):
        assert (await client.get("/admin/queues", headers=user.headers)).status_code == 200
        assert (await client.get(f"/admin/users/{user.id}", headers=ADMIN)).json()["is_admin"] is True
        assert (await client.get("/account", headers=user.headers)).json()["is_admin"] is True
        assert_error(await client.get("/admin/queues", headers=other_user.headers), 403, "forbidden")
    assert_error(await client.get("/admin/queues", headers=user.headers), 403, "forbidden")


async def test_without_a_root_token_only_admin_users_get_in(client, app, user, other_user):
    await make_admin(client, user)
    with settings_changed(app, admin_root_token=None):
        assert (await client.get("/admin/workers", headers=user.headers)).status_code == 200
        assert_error(await client.get("/admin/workers", headers=ADMIN), 403, "admin_disabled")
        assert_error(await client.get("/admin/workers", headers=other_user.headers), 403, "forbidden")


async def test_the_admin_flag_route_checks_its_input(client, user):
    url = f"/admin/users/{user.id}/admin"
    for body in ({}, {"admin": "perhaps"}, {"admin": None}):
        assert_error(await client.put(url, json=body, headers=ADMIN), 422)
    assert_error(
        await client.put("/admin/users/no-such-user/admin", json={"admin": True}, headers=ADMIN), 404
    )
    assert (await client.get(f"/admin/users/{user.id}", headers=ADMIN)).json()["is_admin"] is False


async def test_the_admin_cli_makes_and_unmakes_an_admin_user(client, settings, user):
    made = admin_cli(settings, "set-admin", "--identity", f"debug:{user.name}")
    assert made.returncode == 0, made.stderr
    assert user.id in made.stderr and made.stdout == ""
    assert (await client.get("/admin/workers", headers=user.headers)).status_code == 200
    unmade = admin_cli(settings, "set-admin", "--user-id", user.id, "--off")
    assert unmade.returncode == 0, unmade.stderr
    assert_error(await client.get("/admin/workers", headers=user.headers), 403, "forbidden")

    unknown = admin_cli(settings, "set-admin", "--identity", "debug:nobody-signed-in-as-this")
    assert unknown.returncode != 0 and "no such user" in unknown.stderr
    bad = admin_cli(settings, "set-admin", "--identity", "no colon here")
    assert bad.returncode == 2 and "PROVIDER:ACCOUNT_ID" in bad.stderr
