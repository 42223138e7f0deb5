"""Usage cannot be erased: deleting a chat keeps its generations in GET /usage."""

from __future__ import annotations

from sqlalchemy import update

from oasst_inference_server.db.models import DbMessage, utcnow
from tests.support.api import API, start_chat

pytestmark = API


async def test_deleting_a_chat_keeps_its_usage(client, app, user, live_model):
    conversation = await start_chat(client, user, model=live_model)
    async with app.state.session_factory() as session:
        await session.exec(
            update(DbMessage)
            .where(DbMessage.id == conversation.assistant_id)  # type: ignore[arg-type]
            .values(state="complete", content="ok", finished_at=utcnow(), prompt_tokens=7, generated_tokens=5)
        )
        await session.commit()
    before = (await client.get("/usage", headers=user.headers)).json()
    assert before["total"] == {"requests": 1, "prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}
    deleted = await client.delete(f"/chats/{conversation.chat_id}", headers=user.headers)
    assert deleted.status_code == 204
    assert (await client.get(f"/chats/{conversation.chat_id}", headers=user.headers)).status_code == 404
    after = (await client.get("/usage", headers=user.headers)).json()
    assert after == before
