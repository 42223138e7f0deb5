"""The user cache of access tokens: no database round trip while an entry is fresh, changes made through
this process seen at once, changes made elsewhere seen within ``user_cache_seconds``, a bounded size."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from sqlalchemy import event, update

from oasst_inference_server.auth.refresh_tokens import revoke_user_tokens
from oasst_inference_server.auth.user_cache import UserCache
from oasst_inference_server.db.models import DbUser
from tests.support.api import ADMIN, API, assert_error

pytestmark = API


class Clock:
    """The cache's clock, moved forward by hand (monotonic time plus an offset)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


@pytest.fixture
def clock(app: FastAPI, monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(app.state.user_cache, "clock", clock)
    return clock


@pytest.fixture
def checkouts(app: FastAPI) -> Iterator[list[object]]:
    """The database connections taken from the pool while the test runs."""
    taken: list[object] = []

    def on_checkout(dbapi_connection, _record, _proxy) -> None:
        taken.append(dbapi_connection)

    event.listen(app.state.engine.sync_engine, "checkout", on_checkout)
    yield taken
    event.remove(app.state.engine.sync_engine, "checkout", on_checkout)


async def test_a_fresh_entry_costs_no_database_round_trip(client, login, clock, checkouts):
    user = await login()
    assert (await client.get("/auth/check", headers=user.headers)).status_code == 200
    checkouts.clear()
    assert (await client.get("/auth/check", headers=user.headers)).status_code == 200
    assert checkouts == []  # the token's signature and the cached user state
    clock.offset += 60
    assert (await client.get("/auth/check", headers=user.headers)).status_code == 200
    assert len(checkouts) == 1  # expired: read again


async def test_a_change_made_elsewhere_is_seen_within_the_bound(app, client, login, clock, settings):
    revoked, deleted = await login(), await login()
    for user in (revoked, deleted):
        assert (await client.get("/auth/check", headers=user.headers)).status_code == 200
    # Another server process (or replica) revokes one user's tokens and deletes the other: this
    # process hears nothing of it.
    async with app.state.session_factory() as session:
        await revoke_user_tokens(session, revoked.id)
        await session.exec(update(DbUser).where(DbUser.id == deleted.id).values(deleted=True))
        await session.commit()
    # Just before the bound the cached state still serves; at the bound both are refused.
    clock.offset += settings.user_cache_seconds - 0.5
    assert (await client.get("/auth/check", headers=revoked.headers)).status_code == 200
    clock.offset += 0.5
    assert_error(await client.get("/auth/check", headers=revoked.headers), 401, "token_revoked")
    assert_error(await client.get("/auth/check", headers=deleted.headers), 401, "invalid_token")
    models = await client.get("/v1/models", headers=deleted.headers)  # the OpenAI API's callers too
    assert models.status_code == 401 and models.json()["error"]["code"] == "invalid_token"


async def test_a_change_made_through_this_process_is_seen_at_once(client, login, clock):
    revoked, deleted, deleting_itself = await login(), await login(), await login()
    for user in (revoked, deleted, deleting_itself):
        assert (await client.get("/auth/check", headers=user.headers)).status_code == 200
    assert (await client.post(f"/admin/users/{revoked.id}/revoke_tokens", headers=ADMIN)).status_code == 200
    assert (await client.delete(f"/admin/users/{deleted.id}", headers=ADMIN)).status_code == 204
    assert (await client.delete("/account", headers=deleting_itself.headers)).status_code == 204
    # No clock moved: the entries were dropped.
    assert_error(await client.get("/auth/check", headers=revoked.headers), 401, "token_revoked")
    for gone in (deleted, deleting_itself):
        assert_error(await client.get("/auth/check", headers=gone.headers), 401, "invalid_token")


async def test_the_cache_is_bounded_and_keeps_the_recently_used(app, login):
    users = [await login() for _ in range(5)]
    cache = UserCache(ttl=60, max_entries=3)
    async with app.state.session_factory() as session:
        for user in users:
            assert (await cache.get(session, user.id)).id == user.id  # type: ignore[union-attr]
        assert len(cache) == 3 and [u.id in cache for u in users] == [False, False, True, True, True]
        await cache.get(session, users[2].id)  # used again: the others of the three go first
        await cache.get(session, users[0].id)
        assert len(cache) == 3 and [u.id in cache for u in users] == [True, False, True, False, True]
        assert await cache.get(session, "no-such-user") is None and "no-such-user" not in cache


async def test_the_user_from_the_cache_belongs_to_the_request(app, login, settings):
    """What the cache returns is attached to the asking session, so a request may change and save it;
    the cached copy does not change with it."""
    user = await login()
    cache = UserCache(ttl=60, max_entries=10)
    async with app.state.session_factory() as session:
        await cache.get(session, user.id)
    async with app.state.session_factory() as session:
        found = await cache.get(session, user.id)
        assert found is not None and found in session
        found.tier = next(iter(settings.user_tiers))
        session.add(found)
        await session.commit()
    async with app.state.session_factory() as session:
        stored = await session.get(DbUser, user.id)
        assert stored is not None and stored.tier == next(iter(settings.user_tiers))
        cached = await cache.get(session, user.id)  # this process did not forget it: the old state
        assert cached is not None and cached.tier is None
