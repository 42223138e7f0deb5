"""Signing in without a browser on a production server: the admin CLI's keys, and API keys on the chat API.

``oasst-server admin`` runs as a separate process, as an operator runs it in the server's container,
against the same database as the app under test.
"""

from __future__ import annotations

from oasst_inference_server.auth.worker_keys import find_worker_by_key
from tests.support.admin_cli import admin_cli
from tests.support.api import API, assert_error

pytestmark = API


async def test_an_api_key_from_the_admin_cli_opens_the_chat_api_but_not_key_management(client, settings):
    made = admin_cli(settings, "create-api-key", "--user", "operator-made", "--name", "laptop")
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert key.startswith("oak-") and "\n" not in key  # the key alone on standard output
    assert "user 'operator-made' created" in made.stderr
    bearer = {"Authorization": f"Bearer {key}"}

    check = await client.get("/auth/check", headers=bearer)
    assert check.status_code == 200 and check.json()["display_name"] == "operator-made"
    chat = await client.post("/chats", json={}, headers=bearer)
    assert chat.status_code == 200, chat.text
    assert (await client.get(f"/chats/{chat.json()['id']}", headers=bearer)).status_code == 200
    # Managing keys and the account needs a sign-in, not a key.
    assert_error(await client.get("/api_keys", headers=bearer), 401, "invalid_token")
    assert_error(await client.post("/api_keys", json={"name": "more"}, headers=bearer), 401, "invalid_token")
    assert_error(await client.delete("/account", headers=bearer), 401, "invalid_token")

    # A second key for the same user finds the user; both work.
    again = admin_cli(settings, "create-api-key", "--user", "operator-made")
    assert again.returncode == 0 and "user 'operator-made' created" not in again.stderr
    second = {"Authorization": f"Bearer {again.stdout.strip()}"}
    assert (await client.get("/auth/check", headers=second)).json()["user_id"] == check.json()["user_id"]


async def test_a_revoked_or_unknown_key_is_refused_on_the_chat_api(client, user):
    created = await client.post("/api_keys", json={"name": "temporary"}, headers=user.headers)
    assert created.status_code == 201
    bearer = {"Authorization": f"Bearer {created.json()['key']}"}
    assert (await client.get("/chats", headers=bearer)).status_code == 200
    assert (await client.delete(f"/api_keys/{created.json()['id']}", headers=user.headers)).status_code == 204
    assert_error(await client.get("/chats", headers=bearer), 401, "invalid_api_key")
    unknown = {"Authorization": "Bearer oak-" + "x" * 43}
    assert_error(await client.post("/chats", json={}, headers=unknown), 401, "invalid_api_key")


async def test_a_worker_key_from_the_admin_cli_is_a_registered_worker(client, app, settings):
    from tests.support.api import ADMIN

    made = admin_cli(settings, "create-worker-key", "--name", "gpu-box-7")
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    worker = await find_worker_by_key(app.state.session_factory, key)
    assert worker is not None and worker.name == "gpu-box-7"
    listed = (await client.get("/admin/workers", headers=ADMIN)).json()
    assert [w["api_key_prefix"] for w in listed if w["name"] == "gpu-box-7"] == [key[:10]]
