"""The one way a generation starts (``submission.SubmissionService``): a message that cannot be queued
is still answered, from the database."""

from __future__ import annotations

from oasst_inference_server import events
from oasst_inference_server.db.models import DbMessage
from tests.support.api import API, start_chat

pytestmark = API


async def test_a_message_the_broker_refuses_stays_pending_for_the_recovery_loop(
    client, app, user, live_model, monkeypatch
):
    async def broker_down(message: DbMessage) -> None:
        raise ConnectionError("the broker is away")

    monkeypatch.setattr(app.state.lifecycle, "enqueue", broker_down)
    conversation = await start_chat(client, user, model=live_model)  # still a 200
    assert conversation.assistant_id is not None
    message = await app.state.lifecycle.get(conversation.assistant_id)
    assert message.state == "pending" and message.scheduling["user"] == user.id  # its ticket is stored
    assert conversation.assistant_id not in await app.state.broker.queued_ids(
        events.work_queue_name(live_model)
    )
    monkeypatch.undo()
    await app.state.lifecycle.enqueue(message)  # what the recovery loop does with it
    assert conversation.assistant_id in await app.state.broker.queued_ids(events.work_queue_name(live_model))
