"""The recovery loop's repairs of pending messages: a lost queue entry is put back, a message whose
model has no worker fails naming the model, one past its queue timeout fails saying so; one pass
reads the pending messages once for all three."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from oasst_inference_server import events
from oasst_inference_server.db.models import DbMessage, utcnow
from oasst_inference_server.dispatch.recovery import RecoveryLoop
from tests.support.api import API, start_chat

pytestmark = API


def recovery(app, **settings: float) -> RecoveryLoop:
    return RecoveryLoop(
        app.state.session_factory,
        app.state.broker,
        app.state.lifecycle,
        app.state.registry,
        app.state.settings.model_copy(update=settings),
    )


async def age(app, message_ids: list[str], seconds: float, **values: object) -> None:
    async with app.state.session_factory() as session:
        await session.exec(
            update(DbMessage)
            .where(DbMessage.id.in_(message_ids))
            .values(enqueued_at=utcnow() - timedelta(seconds=seconds), **values)
        )
        await session.commit()


async def test_one_pass_requeues_lost_work_and_fails_the_unservable_and_the_overdue(
    client, app, user, live_model
):
    queue = events.work_queue_name(live_model)
    lost, orphan, overdue, young = [
        (await start_chat(client, user, model=live_model)).assistant_id for _ in range(4)
    ]
    await app.state.broker.remove_work(queue, lost)  # as a Redis restart would
    await age(app, [lost], 30)
    await age(app, [orphan], 30, model_config_name="a-model-no-worker-serves")
    await age(app, [overdue], 120)
    loop = recovery(app, requeue_grace=10, no_worker_timeout=20, queue_timeout=100, worker_ping_interval=0)

    await loop.tick()

    queued = await app.state.broker.queued_ids(queue)
    assert lost in queued and young in queued and overdue not in queued
    assert (await app.state.lifecycle.get(lost)).state == "pending"
    failed = await app.state.lifecycle.get(orphan)
    assert failed.state == "failed"
    assert failed.error == "no worker for model 'a-model-no-worker-serves' connected within 20s"
    timed_out = await app.state.lifecycle.get(overdue)
    assert timed_out.state == "failed" and "queue timeout of 100s" in timed_out.error
    assert (await app.state.lifecycle.get(young)).state == "pending"
    for message_id in (lost, young):
        await app.state.lifecycle.fail(message_id, "test over")


async def test_a_model_must_stay_absent_for_a_few_pings_before_its_messages_fail(
    client, app, user, live_model
):
    message_id = (await start_chat(client, user, model=live_model)).assistant_id
    await age(app, [message_id], 30, model_config_name="a-model-whose-worker-reconnects")
    loop = recovery(app, no_worker_timeout=20, worker_ping_interval=60)
    await loop.tick()  # first seen absent now: the settle time (3 pings) starts
    assert (await app.state.lifecycle.get(message_id)).state == "pending"
    await app.state.lifecycle.fail(message_id, "test over")


async def test_a_message_claimed_since_the_snapshot_is_not_requeued(client, app, user, live_model):
    queue = events.work_queue_name(live_model)
    message_id = (await start_chat(client, user, model=live_model)).assistant_id
    await app.state.broker.remove_work(queue, message_id)
    await age(app, [message_id], 30)
    loop = recovery(app, requeue_grace=10)
    snapshot = await loop._pending_longer_than(timedelta(seconds=10))
    assert message_id in [w.id for w in snapshot]  # with what earlier tests left pending
    await age(app, [message_id], 30, state="in_progress")  # a worker took it in between
    await loop.requeue_lost_work(snapshot)
    assert message_id not in await app.state.broker.queued_ids(queue)
    await app.state.lifecycle.fail(message_id, "test over")
