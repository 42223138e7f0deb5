"""A new job goes straight to an idle worker of this process, sent inside the transaction that creates it
(``scheduling/handoff.py``). Checked in-process on the real Postgres and Redis with the app's real
dispatcher and a stand-in socket: the worker gets the job with nothing queued, its answer is stored only
once the submission has committed, a commit that fails makes the job void and stores nothing, a send that
fails leaves the message queued as usual, a job never jumps one that waits, and the fair queue counts a
handed-over job exactly as a queued one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server import events
from oasst_inference_server.broker import InMemoryBroker
from oasst_inference_server.scheduling.dispatcher import Dispatchers
from oasst_inference_server.scheduling.fair_share import Ticket
from oasst_inference_server.scheduling.handoff import Handoff
from oasst_inference_server.workers.worker_connection import WorkerConnection
from oasst_shared.protocol import GeneratedText, Token
from tests.support.api import API, start_chat
from tests.support.worker_socket import StandInSocket, stand_in_connection, stream_types, until

pytestmark = API


@asynccontextmanager
async def idle_worker(app: Any, model: str, socket: StandInSocket) -> AsyncIterator[WorkerConnection]:
    """A worker connection of ``model`` on the app's own dispatcher, which waits on the empty queue."""
    dispatcher = app.state.dispatchers.for_model(model)
    conn = stand_in_connection(app, model, socket, dispatcher)
    task = asyncio.create_task(conn.run())
    try:
        await until(lambda: dispatcher.waiting)
        yield conn
    finally:
        socket.hang_up()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 10)


class Pushes:
    """Records the queues the broker is asked to push to (a job handed over is pushed nowhere)."""

    def __init__(self, app: Any, monkeypatch: Any) -> None:
        self.queues: list[str] = []
        real = app.state.broker.push_work

        async def push_work(queue: str, message_id: str, **kwargs: Any) -> None:
            self.queues.append(queue)
            await real(queue, message_id, **kwargs)

        monkeypatch.setattr(app.state.broker, "push_work", push_work)


async def test_an_idle_worker_gets_a_new_job_without_a_queue_and_its_answer_waits_for_the_commit(
    client, app, user, live_model, monkeypatch
):
    pushes = Pushes(app, monkeypatch)
    socket = StandInSocket()
    commit_started = asyncio.Event()
    release_commit = asyncio.Event()
    real_commit = AsyncSession.commit

    async def slow_commit(self: AsyncSession) -> None:
        if socket.sent_types() == ["work"] and not release_commit.is_set():
            commit_started.set()
            await release_commit.wait()
        await real_commit(self)

    async with idle_worker(app, live_model, socket) as conn:
        monkeypatch.setattr(AsyncSession, "commit", slow_commit)
        posting = asyncio.create_task(start_chat(client, user, "hello", live_model))
        await commit_started.wait()
        # The worker has the job before the submission committed; what it answers is held back.
        [work] = socket.sent
        message_id = work["message_id"]
        socket.say(Token(message_id=message_id, text="hi"))
        await asyncio.sleep(0.2)
        assert await stream_types(app, message_id) == []
        release_commit.set()
        chat = await posting
        assert chat.assistant_id == message_id
        await until(lambda: _has_events(app, message_id, ["token"]))
        socket.say(
            GeneratedText(message_id=message_id, text="hi", finish_reason="length", generated_tokens=1)
        )
        await until(lambda: _state_is(app, message_id, "complete"))
        await until(lambda: conn.free_slots == 1)
    done = await app.state.lifecycle.get(message_id)
    assert (done.worker_session_id, done.attempts, done.content) == (conn.session_id, 1, "hi")
    assert events.work_queue_name(live_model) not in pushes.queues


async def test_a_failed_commit_voids_the_handed_over_job_and_stores_nothing(
    client, app, user, live_model, monkeypatch
):
    socket = StandInSocket()
    real_commit = AsyncSession.commit

    async def failing_commit(self: AsyncSession) -> None:
        if socket.sent_types() == ["work"]:
            await self.rollback()
            raise ConnectionResetError("the database connection was lost at the commit")
        await real_commit(self)

    chat = await start_chat(client, user, "hello")
    async with idle_worker(app, live_model, socket) as conn:
        monkeypatch.setattr(AsyncSession, "commit", failing_commit)
        # The app answers 503 ("storage unavailable"); the in-process transport re-raises the error too.
        with contextlib.suppress(ConnectionResetError):
            response = await client.post(
                f"/chats/{chat.chat_id}/assistant_message",
                json={"parent_id": chat.prompter_id, "model_config_name": live_model},
                headers=user.headers,
            )
            assert response.status_code == 503
        monkeypatch.setattr(AsyncSession, "commit", real_commit)
        await until(lambda: socket.sent_types() == ["work", "cancel"])
        message_id = socket.sent[0]["message_id"]
        assert socket.sent[1]["message_id"] == message_id
        assert await app.state.lifecycle.get(message_id) is None
        # The worker had started: its tokens are dropped; its answer to the cancel frees the slot.
        socket.say(Token(message_id=message_id, text="stray"))
        socket.say(
            GeneratedText(message_id=message_id, text="stray", finish_reason="cancelled", generated_tokens=1)
        )
        await until(lambda: conn.free_slots == 1)
        assert await stream_types(app, message_id) == []
        assert await app.state.lifecycle.get(message_id) is None


async def test_a_send_that_fails_queues_the_message_as_usual_and_ends_the_connection(
    client, app, user, live_model, monkeypatch
):
    pushes = Pushes(app, monkeypatch)
    socket = StandInSocket()
    async with idle_worker(app, live_model, socket) as conn:
        socket.fail_sends = True
        chat = await start_chat(client, user, "hello", live_model)
        message_id = chat.assistant_id
        assert message_id is not None
        pending = await app.state.lifecycle.get(message_id)
        assert (pending.state, pending.attempts, pending.worker_session_id) == ("pending", 0, None)
        assert pushes.queues[0] == events.work_queue_name(live_model)
        await until(lambda: socket.closed_with is not None)  # the connection ended
        assert conn.in_flight == set()


async def test_with_the_setting_off_every_job_is_queued(client, app, user, live_model, monkeypatch):
    monkeypatch.setattr(app.state.submission, "_handoff", None)
    pushes = Pushes(app, monkeypatch)
    socket = StandInSocket()
    async with idle_worker(app, live_model, socket):
        chat = await start_chat(client, user, "hello", live_model)
        await until(lambda: socket.sent_types() == ["work"])
        assert socket.sent[0]["message_id"] == chat.assistant_id
        assert pushes.queues == [events.work_queue_name(live_model)]


class RecordingConnection:
    """Stands in for a worker connection in the hand-over's own checks."""

    def __init__(self, session_id: str, *, sends: bool = True) -> None:
        from oasst_inference_server.scheduling.capacity import WorkerCapacity

        self.session_id = session_id
        self.capacity = WorkerCapacity(session_id, declared_slots=1)
        self.capacity.takes_user_work = True
        self.sends = sends
        self.reserved = 0
        self.handed: list[str] = []

    def assign(self, message_id: str, max_new_tokens: int | None = None) -> None:
        raise AssertionError("a hand-over assigns nothing through the queue")

    def reserve(self) -> None:
        self.reserved += 1
        self.capacity.in_flight += 1

    def unreserve(self) -> None:
        self.reserved -= 1
        self.capacity.in_flight -= 1

    async def hand_over(self, session: Any, message: Any, permit: Any, known: Any = ()) -> bool:
        if not await permit:
            self.unreserve()
            return False
        if self.sends:
            self.handed.append(message.id)
        else:
            self.unreserve()
        return self.sends

    async def handed(self, message_id: str, *, committed: bool) -> None:
        pass


def _ticket(user: str) -> Ticket:
    return Ticket(user=user, prompt_tokens=10, max_new_tokens=20, weight=1.0)


async def _drain(broker: Any, queue: str) -> list[str]:
    popped = []
    while (item := await broker.pop_work(queue, 0)) is not None:
        popped.append(item)
    return popped


async def test_a_job_never_jumps_one_that_waits_and_is_counted_as_if_queued(settings: Any) -> None:
    from oasst_inference_server.db.models import DbMessage

    queue = events.work_queue_name("m")
    broker, twin = InMemoryBroker(), InMemoryBroker()
    dispatchers = Dispatchers(broker, lifecycle=None)  # type: ignore[arg-type]
    dispatcher = dispatchers.for_model("m")
    worker = RecordingConnection("ws-a")
    dispatcher.workers[worker.session_id] = worker  # type: ignore[assignment]
    handoff = Handoff(dispatchers, broker, settings)
    cost = _ticket("A").estimated_cost(settings)

    def message(message_id: str) -> DbMessage:
        return DbMessage(id=message_id, model_config_name="m", role="assistant", state="pending")

    # Not while the dispatcher is placing something (it is not waiting on the queue).
    assert await handoff.try_hand_over(None, message("x0"), _ticket("A")) is None  # type: ignore[arg-type]
    dispatcher.waiting = True
    # Not while a hint waits: the job queues behind it, and nothing is counted.
    await broker.push_work(queue, "b0", user="B", cost=cost)
    await twin.push_work(queue, "b0", user="B", cost=cost)
    assert await handoff.try_hand_over(None, message("x1"), _ticket("A")) is None  # type: ignore[arg-type]
    assert worker.reserved == 0
    assert await _drain(broker, queue) == await _drain(twin, queue) == ["b0"]
    # A refused send leaves the counters as they were.
    worker.sends = False
    assert await handoff.try_hand_over(None, message("x2"), _ticket("A")) is None  # type: ignore[arg-type]
    assert worker.reserved == 0
    # Handed over: counted exactly as a push and a pop of it.
    worker.sends = True
    handed = await handoff.try_hand_over(None, message("a0"), _ticket("A"))  # type: ignore[arg-type]
    assert handed is not None and worker.handed == ["a0"]
    await twin.push_work(queue, "a0", user="A", cost=cost)
    assert await twin.pop_work(queue, 0) == "a0"
    for each in (broker, twin):
        for i in range(3):
            await each.push_work(queue, f"a{i + 1}", user="A", cost=cost)
            await each.push_work(queue, f"c{i}", user="C", cost=cost)
    assert await _drain(broker, queue) == await _drain(twin, queue)
    # A worker with no room: queued.
    dispatcher.waiting = True
    assert await handoff.try_hand_over(None, message("x3"), _ticket("A")) is None  # type: ignore[arg-type]


async def _has_events(app: Any, message_id: str, types: list[str]) -> bool:
    return await stream_types(app, message_id) == types


async def _state_is(app: Any, message_id: str, state: str) -> bool:
    message = await app.state.lifecycle.get(message_id)
    return message is not None and message.state == state


async def test_a_reservation_given_back_leaves_the_worker_as_free_as_it_reported(app, live_model):
    conn = stand_in_connection(
        app, live_model, StandInSocket(), app.state.dispatchers.for_model(live_model), slots=2
    )
    conn.capacity.reported_free_slots = 2  # as its last pong said
    conn.reserve()
    assert conn.free_slots == 1
    conn.unreserve()
    assert conn.free_slots == 2


async def test_a_new_chat_s_first_answer_is_handed_over_without_reading_its_conversation() -> None:
    from oasst_inference_server.db.models import DbMessage
    from oasst_inference_server.dispatch.claim import conversation, thread_to
    from oasst_shared.protocol import ChatTurn

    class NoDatabase:
        async def connection(self) -> Any:
            raise AssertionError("the conversation was read from the database")

    root = DbMessage(id="p", chat_id="c", parent_id=None, role="prompter", content="hi", kind="chat")
    answer = DbMessage(id="m", chat_id="c", parent_id="p", role="assistant", kind="chat")
    rows = await conversation(NoDatabase(), answer, (root,))  # type: ignore[arg-type]
    assert thread_to("p", rows) == [ChatTurn(role="user", content="hi")]
    # A later turn's parent has ancestors the caller does not hold: they are read.
    later = DbMessage(id="p2", chat_id="c", parent_id="a1", role="prompter", content="more", kind="chat")
    reply = DbMessage(id="m2", chat_id="c", parent_id="p2", role="assistant", kind="chat")
    with pytest.raises(AssertionError, match="read from the database"):
        await conversation(NoDatabase(), reply, (later,))  # type: ignore[arg-type]
