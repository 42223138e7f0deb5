"""The admin API: root token, workers and their keys, live sessions, users."""

from __future__ import annotations

import uuid

import pytest

from oasst_inference_server.auth.worker_keys import find_worker_by_key, record_worker_event
from oasst_inference_server.broker import WorkerSession
from oasst_shared.model_configs import SMOLLM2_135M
from tests.support.api import ADMIN, API, assert_error, start_chat

pytestmark = API

ADMIN_ROUTES = [
    ("POST", "/admin/workers", {"name": "w"}),
    ("GET", "/admin/workers", None),
    ("POST", "/admin/workers/{id}/api_key", None),
    ("PUT", "/admin/workers/{id}/limits", {}),
    ("PUT", "/admin/workers/{id}/trust", {"trusted": True}),
    ("GET", "/admin/compliance_checks", None),
    ("DELETE", "/admin/workers/{id}", None),
    ("GET", "/admin/worker_sessions", None),
    ("GET", "/admin/users/{id}", None),
    ("POST", "/admin/users/{id}/revoke_tokens", None),
    ("DELETE", "/admin/users/{id}", None),
    ("PUT", "/admin/users/{id}/tier", {"tier": "priority"}),
    ("PUT", "/admin/users/{id}/admin", {"admin": True}),
    ("GET", "/admin/queues", None),
    ("GET", "/admin/rebalancer", None),
]


@pytest.mark.parametrize("method, template, body", ADMIN_ROUTES, ids=[f"{m} {t}" for m, t, _ in ADMIN_ROUTES])
async def test_admin_routes_need_the_root_token(client, app, user, method, template, body):
    url = template.format(id=user.id)
    kwargs = {"json": body} if body is not None else {}
    assert_error(await client.request(method, url, **kwargs), 401, "not_authenticated")
    # A user's access token is not the root token.
    assert_error(await client.request(method, url, headers=user.headers, **kwargs), 403, "forbidden")
    wrong = {"Authorization": "Bearer " + "x" * 40}
    assert_error(await client.request(method, url, headers=wrong, **kwargs), 403, "forbidden")
    original = app.state.settings
    app.state.settings = original.model_copy(update={"admin_root_token": None})
    try:
        assert_error(await client.request(method, url, headers=ADMIN, **kwargs), 403, "admin_disabled")
    finally:
        app.state.settings = original
    # Nothing was changed by the refused calls.
    assert (await client.get("/auth/check", headers=user.headers)).status_code == 200


async def test_worker_keys_are_shown_once_and_stored_hashed(client, app):
    created = await client.post("/admin/workers", json={"name": "gpu-box-1"}, headers=ADMIN)
    assert created.status_code == 201, created.text
    worker = created.json()
    key = worker["api_key"]
    assert key.startswith("owk_") and worker["api_key_prefix"] == key[:10] and worker["name"] == "gpu-box-1"
    listed = (await client.get("/admin/workers", headers=ADMIN)).json()
    mine = next(w for w in listed if w["id"] == worker["id"])
    assert "api_key" not in mine and mine["connected_sessions"] == 0
    sessions = app.state.session_factory
    found = await find_worker_by_key(sessions, key)
    assert found is not None and found.id == worker["id"] and key not in found.api_key_hash
    assert await find_worker_by_key(sessions, key + "x") is None
    assert await find_worker_by_key(sessions, None) is None

    # A new key replaces the old one.
    rotated = await client.post(f"/admin/workers/{worker['id']}/api_key", headers=ADMIN)
    assert rotated.status_code == 200
    new_key = rotated.json()["api_key"]
    assert new_key != key
    assert await find_worker_by_key(sessions, key) is None
    assert (await find_worker_by_key(sessions, new_key)) is not None

    # Deleting the worker ends its key.
    assert (await client.delete(f"/admin/workers/{worker['id']}", headers=ADMIN)).status_code == 204
    assert await find_worker_by_key(sessions, new_key) is None
    assert worker["id"] not in [w["id"] for w in (await client.get("/admin/workers", headers=ADMIN)).json()]
    assert_error(
        await client.delete(f"/admin/workers/{worker['id']}", headers=ADMIN), 404, "worker_not_found"
    )
    assert_error(
        await client.post(f"/admin/workers/{worker['id']}/api_key", headers=ADMIN), 404, "worker_not_found"
    )
    assert_error(await client.post("/admin/workers", json={"name": ""}, headers=ADMIN), 422)


async def test_live_worker_sessions_with_capacity_and_in_flight_work(client, app):
    worker = (await client.post("/admin/workers", json={"name": "session-box"}, headers=ADMIN)).json()
    session_id = f"ws-admin-{uuid.uuid4().hex[:8]}"
    live = WorkerSession(
        model_config=SMOLLM2_135M.model_copy(update={"name": "admin-test-model"}),
        max_parallel_requests=4,
        free_slots=3,
        in_flight=["m-1"],
        backend_kind="tgi",
        worker_version="1.2.3",
        connected_at=1700000000.0,
        backend_model_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        backend_model_revision="sha256:abc",
        backend_version="version 0.1.0, llama.cpp 0.3.2",
    )
    await record_worker_event(
        app.state.session_factory, worker_id=worker["id"], session_id=session_id, event_type="connected"
    )
    await app.state.broker.put_worker_session(live.record(session_id), ttl=60)
    try:
        sessions = (await client.get("/admin/worker_sessions", headers=ADMIN)).json()
        mine = next(s for s in sessions if s["session_id"] == session_id)
        assert mine == {
            "session_id": session_id,
            "model_config_name": "admin-test-model",
            "worker_id": worker["id"],
            "worker_name": "session-box",
            "max_parallel_requests": 4,
            "free_slots": 3,
            "in_flight": ["m-1"],
            "backend_kind": "tgi",
            "backend_healthy": True,
            "draining": False,
            "worker_version": "1.2.3",
            "connected_at": 1700000000.0,
            "backend_model_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
            "backend_model_revision": "sha256:abc",
            "backend_version": "version 0.1.0, llama.cpp 0.3.2",
            "trusted": False,
            "flagged": False,
        }
        listed = (await client.get("/admin/workers", headers=ADMIN)).json()
        assert next(w for w in listed if w["id"] == worker["id"])["connected_sessions"] == 1
    finally:
        await app.state.broker.remove_worker_session(session_id)
    # The history stays when the worker is deleted.
    await client.delete(f"/admin/workers/{worker['id']}", headers=ADMIN)
    from sqlalchemy import select

    from oasst_inference_server.db.models import DbWorkerEvent

    async with app.state.session_factory() as db:
        events = (
            (await db.exec(select(DbWorkerEvent).where(DbWorkerEvent.session_id == session_id)))
            .scalars()
            .all()
        )
    assert [(e.event_type, e.worker_id) for e in events] == [("connected", None)]


async def test_revoke_a_users_refresh_tokens(client, login):
    user = await login()
    second = (await client.get("/auth/callback/debug", params={"code": user.name})).json()
    response = await client.post(f"/admin/users/{user.id}/revoke_tokens", headers=ADMIN)
    assert response.status_code == 200 and response.json() == {"revoked": 2}
    for token in (user.refresh_token, second["refresh_token"]["access_token"]):
        assert_error(
            await client.post("/auth/refresh", json={"refresh_token": token}), 401, "refresh_token_revoked"
        )
    assert (await client.post(f"/admin/users/{user.id}/revoke_tokens", headers=ADMIN)).json() == {
        "revoked": 0
    }


async def test_revoking_a_users_tokens_ends_the_access_tokens_already_issued(client, login, other_user):
    user = await login()
    second = (await client.get("/auth/callback/debug", params={"code": user.name})).json()
    second_access = {"Authorization": f"Bearer {second['access_token']['access_token']}"}
    assert (await client.get("/chats", headers=user.headers)).status_code == 200
    assert (await client.post(f"/admin/users/{user.id}/revoke_tokens", headers=ADMIN)).status_code == 200
    # Both sign-ins' access tokens stop at once, long before they would expire.
    for headers in (user.headers, second_access):
        assert_error(await client.get("/chats", headers=headers), 401, "token_revoked")
    # Another user is untouched, and signing in again gives working tokens.
    assert (await client.get("/chats", headers=other_user.headers)).status_code == 200
    again = (await client.get("/auth/callback/debug", params={"code": user.name})).json()
    fresh = {"Authorization": f"Bearer {again['access_token']['access_token']}"}
    assert (await client.get("/chats", headers=fresh)).status_code == 200
    refreshed = await client.post(
        "/auth/refresh", json={"refresh_token": again["refresh_token"]["access_token"]}
    )
    assert refreshed.status_code == 200, refreshed.text
    assert_error(await client.post("/admin/users/nobody/revoke_tokens", headers=ADMIN), 404, "user_not_found")


async def test_admin_deletes_a_user(client, login, live_model):
    user = await login()
    await start_chat(client, user, model=live_model)
    info = (await client.get(f"/admin/users/{user.id}", headers=ADMIN)).json()
    assert info["display_name"] == user.name and info["chat_count"] == 1 and info["deleted"] is False
    assert (await client.delete(f"/admin/users/{user.id}", headers=ADMIN)).status_code == 204
    assert_error(await client.get("/auth/check", headers=user.headers), 401, "invalid_token")
    info = (await client.get(f"/admin/users/{user.id}", headers=ADMIN)).json()
    assert (
        info["deleted"] is True and info["display_name"] == "deleted user" and info["provider"] == "deleted"
    )
    assert_error(await client.delete(f"/admin/users/{user.id}", headers=ADMIN), 404, "user_not_found")
    assert_error(await client.get("/admin/users/nobody", headers=ADMIN), 404, "user_not_found")


async def test_worker_key_limits_are_set_listed_and_validated(client):
    limits = {"allowed_models": ["a-model"], "max_slots": 4, "max_sockets": 2}
    created = await client.post("/admin/workers", json={"name": "bounded", **limits}, headers=ADMIN)
    assert created.status_code == 201, created.text
    worker = created.json()
    assert {k: worker[k] for k in limits} == limits
    changed = await client.put(f"/admin/workers/{worker['id']}/limits", json={"max_slots": 8}, headers=ADMIN)
    assert changed.status_code == 200, changed.text
    assert (changed.json()["allowed_models"], changed.json()["max_slots"], changed.json()["max_sockets"]) == (
        None,
        8,
        None,
    )
    listed = next(
        w for w in (await client.get("/admin/workers", headers=ADMIN)).json() if w["id"] == worker["id"]
    )
    assert listed["max_slots"] == 8
    for bad in ({"max_slots": 0}, {"max_slots": 5000}, {"max_sockets": 0}, {"allowed_models": [""]}):
        assert_error(await client.put(f"/admin/workers/{worker['id']}/limits", json=bad, headers=ADMIN), 422)
    assert_error(
        await client.put("/admin/workers/nope/limits", json={}, headers=ADMIN), 404, "worker_not_found"
    )


async def test_the_rebalancer_status_shows_its_settings_and_decisions(client, app):
    app.state.rebalancer.decisions.clear()
    status = await client.get("/admin/rebalancer", headers=ADMIN)
    assert status.status_code == 200, status.text
    body = status.json()
    assert body["enabled"] is (app.state.settings.rebalance_interval > 0)
    assert body["decisions"] == [] and isinstance(body["models"], list)
