"""Admin users on two replicas sharing Postgres and Redis: a user made an admin on one replica is an admin
on the other at once, and so is the end of it, although the other replica's user cache has just seen
the user (the admin API reads the flag from the database on every call)."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.test_replicas import ADMIN_TOKEN, replicas, shared_database, shared_prefix  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

ROOT = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def test_making_and_unmaking_an_admin_user_holds_on_every_replica_at_once(replicas):  # noqa: F811
    first, second = replicas
    login = httpx.get(f"{first}/auth/callback/debug", params={"code": "replica-admin"}, timeout=30)
    login.raise_for_status()
    user = {"Authorization": f"Bearer {login.json()['access_token']['access_token']}"}
    with httpx.Client(base_url=second, timeout=30) as other:
        account = other.get("/account", headers=user)  # the second replica's cache now holds the user
        assert account.status_code == 200 and account.json()["is_admin"] is False
        refused = other.get("/admin/queues", headers=user)
        assert refused.status_code == 403 and refused.json()["code"] == "forbidden"

        made = httpx.put(
            f"{first}/admin/users/{account.json()['id']}/admin", json={"admin": True}, headers=ROOT
        )
        assert made.status_code == 200 and made.json()["is_admin"] is True
        assert other.get("/admin/queues", headers=user).status_code == 200
        assert other.get("/admin/fleet", headers=user).status_code == 200

        unmade = httpx.put(
            f"{first}/admin/users/{account.json()['id']}/admin", json={"admin": False}, headers=ROOT
        )
        assert unmade.status_code == 200 and unmade.json()["is_admin"] is False
        assert other.get("/admin/queues", headers=user).status_code == 403
