"""A worker connection sends a job before its claim is committed (the commit's disk flush is off the
dispatch path). Checked in-process on the real Postgres and Redis, with a stand-in socket: the claim
locks the message against every other session until it ends; nothing the worker answers is kept before
the commit; a commit that fails voids the job (the worker is told to cancel, its tokens are dropped, the
message goes back to the queue with no attempt spent); a socket that fails before the send leaves the
message pending and queued; a claim that finds the message cancelled sends nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from oasst_inference_server import events
from oasst_inference_server.dispatch.message_lifecycle import MessageLifecycle
from oasst_inference_server.workers.worker_connection import WorkerConnection
from oasst_shared.protocol import CLOSE_POLICY_VIOLATION, GeneratedText, Token
from tests.support.api import API, start_chat
from tests.support.worker_socket import StandInSocket, stand_in_connection, stream_types, until

pytestmark = API


class Commits:
    """Wraps the real lifecycle's claim: the block runs as in production, then the commit waits for
    ``release`` and, with ``fail``, fails (the real transaction rolls back, as on a lost connection)."""

    def __init__(self, lifecycle: MessageLifecycle, *, fail: bool = False) -> None:
        self._real = lifecycle.open_claim
        self.fail = fail
        self.release = asyncio.Event()
        self.waiting = asyncio.Event()

    @asynccontextmanager
    async def open_claim(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async with self._real(*args, **kwargs) as claimed:
            yield claimed
            if claimed is not None:
                self.waiting.set()
                await self.release.wait()
                if self.fail:
                    raise ConnectionResetError("the database connection was lost at the commit")


class StubDispatcher:
    def capacity_changed(self) -> None:
        pass

    def attach(self, connection: Any) -> None:
        pass

    async def detach(self, connection: Any) -> None:
        pass


@asynccontextmanager
async def connection(
    app: Any, model: str, socket: StandInSocket, settings: Any = None
) -> AsyncIterator[WorkerConnection]:
    conn = stand_in_connection(app, model, socket, StubDispatcher(), settings=settings)
    task = asyncio.create_task(conn.run())
    try:
        yield conn
    finally:
        socket.hang_up()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 10)


async def popped_answer(client: Any, app: Any, user: Any, model: str) -> str:
    """A new pending answer whose hint was taken from the queue, as the dispatcher does before it
    assigns the job."""
    message_id = (await start_chat(client, user, "a question", model)).assistant_id
    assert message_id is not None
    await app.state.broker.remove_work(events.work_queue_name(model), message_id)
    return message_id


async def queued(app: Any, model: str) -> list[str]:
    return list(await app.state.broker.queued_ids(events.work_queue_name(model)))


async def test_the_answer_waits_for_the_commit_and_the_claim_locks_out_other_sessions(
    client, app, user, live_model, monkeypatch
):
    message_id = await popped_answer(client, app, user, live_model)
    lifecycle = app.state.lifecycle
    commits = Commits(lifecycle)
    monkeypatch.setattr(lifecycle, "open_claim", commits.open_claim)
    socket = StandInSocket()
    async with connection(app, live_model, socket) as conn:
        conn.assign(message_id)
        await commits.waiting.wait()
        assert socket.sent_types() == ["work"]  # sent before the commit
        socket.say(Token(message_id=message_id, text="early"))
        # Another session's claim waits for the row and then finds the message taken.
        monkeypatch.setattr(lifecycle, "open_claim", commits._real)
        rival = asyncio.create_task(lifecycle.claim(message_id, "ws-rival"))
        await asyncio.sleep(0.3)
        assert not rival.done()
        assert await stream_types(app, message_id) == []  # the token is held back
        commits.release.set()
        assert await rival is None
        await until(lambda: _has_token(app, message_id))
        socket.say(
            GeneratedText(message_id=message_id, text="early", finish_reason="length", generated_tokens=1)
        )
        await until(lambda: _state_is(lifecycle, message_id, "complete"))
    done = await lifecycle.get(message_id)
    assert (done.worker_session_id, done.attempts, done.content) == (conn.session_id, 1, "early")


async def test_a_failed_commit_voids_the_job_and_requeues_the_message(
    client, app, user, live_model, monkeypatch
):
    message_id = await popped_answer(client, app, user, live_model)
    lifecycle = app.state.lifecycle
    commits = Commits(lifecycle, fail=True)
    commits.release.set()
    monkeypatch.setattr(lifecycle, "open_claim", commits.open_claim)
    socket = StandInSocket()
    async with connection(app, live_model, socket) as conn:
        conn.assign(message_id)
        await until(lambda: socket.sent_types() == ["work", "cancel"])
        assert socket.sent[1]["message_id"] == message_id
        # Back in the queue, pending, no attempt spent.
        await until(lambda: _in_queue(app, live_model, message_id))
        pending = await lifecycle.get(message_id)
        assert (pending.state, pending.attempts, pending.worker_session_id) == ("pending", 0, None)
        # The worker had started: its tokens are dropped; its answer to the cancel frees the slot.
        assert conn.free_slots == 0
        socket.say(Token(message_id=message_id, text="stray"))
        socket.say(
            GeneratedText(message_id=message_id, text="stray", finish_reason="cancelled", generated_tokens=1)
        )
        await until(lambda: conn.free_slots == 1)
        assert await stream_types(app, message_id) == []
        assert (await lifecycle.get(message_id)).state == "pending"


async def test_a_socket_that_fails_before_the_send_leaves_the_message_queued(client, app, user, live_model):
    message_id = await popped_answer(client, app, user, live_model)
    socket = StandInSocket(fail_sends=True)
    async with connection(app, live_model, socket) as conn:
        conn.assign(message_id)
        await until(lambda: _in_queue(app, live_model, message_id))
    pending = await app.state.lifecycle.get(message_id)
    assert (pending.state, pending.attempts, pending.worker_session_id) == ("pending", 0, None)


async def test_a_worker_that_does_not_read_is_disconnected_and_gives_back_the_claim_and_its_connection(
    client, app, user, live_model
):
    """The job is sent inside the claim's transaction: a worker whose socket never drains must not hold
    that database connection (nor the message's row lock) for longer than ``worker_send_timeout``."""
    message_id = await popped_answer(client, app, user, live_model)
    settings = app.state.settings.model_copy(update={"worker_send_timeout": 0.3})
    pool = app.state.engine.sync_engine.pool
    socket = StandInSocket(stall_sends=True)
    async with connection(app, live_model, socket, settings) as conn:
        conn.assign(message_id)
        await until(lambda: socket.closed_with is not None)
        assert socket.closed_with == CLOSE_POLICY_VIOLATION
        assert pool.checkedout() == 0
        await until(lambda: _in_queue(app, live_model, message_id))
    pending = await app.state.lifecycle.get(message_id)
    assert (pending.state, pending.attempts, pending.worker_session_id) == ("pending", 0, None)
    # The row is not locked: another worker's claim takes it at once.
    async with asyncio.timeout(5):
        claimed = await app.state.lifecycle.claim(message_id, "ws-next")
    assert claimed is not None


async def test_a_claim_that_finds_the_message_cancelled_sends_nothing(client, app, user, live_model):
    chat = await start_chat(client, user, "never mind", live_model)
    message_id = chat.assistant_id
    lifecycle = app.state.lifecycle
    await lifecycle.request_cancel(await lifecycle.get(message_id))
    socket = StandInSocket()
    async with connection(app, live_model, socket) as conn:
        conn.assign(message_id)
        await until(lambda: conn.free_slots == 1)
        assert socket.sent_types() == []
    cancelled = await lifecycle.get(message_id)
    assert (cancelled.state, cancelled.attempts, cancelled.worker_session_id) == ("cancelled", 0, None)


async def _has_token(app: Any, message_id: str) -> bool:
    return "token" in await stream_types(app, message_id)


async def _state_is(lifecycle: MessageLifecycle, message_id: str, state: str) -> bool:
    message = await lifecycle.get(message_id)
    return message is not None and message.state == state


async def _in_queue(app: Any, model: str, message_id: str) -> bool:
    return message_id in await queued(app, model)
