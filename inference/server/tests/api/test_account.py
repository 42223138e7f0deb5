"""The user's own account: reading it and deleting it (anonymised)."""

from __future__ import annotations

from oasst_inference_server.db.models import DbChat, DbMessage, DbRefreshToken, DbUser
from tests.support.api import API, assert_error, start_chat, trusted_header

pytestmark = API


async def test_get_account(client, user):
    account = (await client.get("/account", headers=user.headers)).json()
    assert (
        account["id"] == user.id and account["provider"] == "debug" and account["display_name"] == user.name
    )
    assert_error(await client.get("/account"), 401, "not_authenticated")


async def test_delete_account_anonymises_the_user_and_their_data(client, app, login, live_model):
    from sqlalchemy import select

    user = await login()
    kept = await start_chat(client, user, "keep me for research", model=live_model)
    private = await start_chat(client, user, "my secret", model=live_model)
    await client.put(f"/chats/{private.chat_id}", json={"allow_data_use": False}, headers=user.headers)
    api_key = await client.post("/api_keys", json={"name": "k"}, headers=user.headers)
    assert api_key.status_code == 201, api_key.text

    assert (await client.delete("/account", headers=user.headers)).status_code == 204

    # Every credential stops working at once.
    assert_error(await client.get("/auth/check", headers=user.headers), 401, "invalid_token")
    assert_error(await client.post("/auth/refresh", json={"refresh_token": user.refresh_token}), 401)
    async with app.state.session_factory() as session:
        row = await session.get(DbUser, user.id)
        assert row is not None and row.deleted and row.deleted_at is not None
        assert (row.display_name, row.provider, row.provider_account_id) == (
            "deleted user",
            "deleted",
            user.id,
        )
        tokens = (
            (await session.exec(select(DbRefreshToken).where(DbRefreshToken.user_id == user.id)))
            .scalars()
            .all()
        )
        assert tokens and all(t.revoked_at is not None for t in tokens)
        # The private chat is gone; the other is kept, anonymous and hidden.
        assert await session.get(DbChat, private.chat_id) is None
        assert await session.get(DbMessage, private.prompter_id) is None
        chat = await session.get(DbChat, kept.chat_id)
        assert chat is not None and chat.title is None and chat.hidden
        # Running answers were cancelled.
        answer = await session.get(DbMessage, kept.assistant_id)
        assert answer is not None and answer.state == "cancelled"
        from oasst_inference_server.db.models import DbApiKey

        keys = (await session.exec(select(DbApiKey).where(DbApiKey.user_id == user.id))).scalars().all()
        assert keys and all(k.revoked_at is not None for k in keys)
    # Signing in with the same name starts a new, empty account.
    again = (await client.get("/auth/callback/debug", params={"code": user.name})).json()
    headers = {"Authorization": f"Bearer {again['access_token']['access_token']}"}
    assert (await client.get("/auth/check", headers=headers)).json()["user_id"] != user.id
    assert (await client.get("/chats", headers=headers, params={"include_hidden": True})).json()[
        "chats"
    ] == []


async def test_deleted_trusted_client_user_cannot_come_back(client):
    headers = trusted_header()
    assert (await client.post("/auth/trusted", headers=headers)).status_code == 200
    assert (await client.delete("/account", headers=headers)).status_code == 204
    assert_error(await client.get("/chats", headers=headers), 401, "user_deleted")
