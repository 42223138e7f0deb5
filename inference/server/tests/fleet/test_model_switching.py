"""Model switches (protocol 6) on the real app, in-process, on Postgres and Redis: real worker connections
on stand-in sockets, told to switch by the ``ModelSwitcher`` through the broker's command channel (as from
any replica). A switch takes the worker out of dispatch, its progress is published, its new worker_info
moves the session to the new model (the next job of that model goes to it); a worker that lies (an unasked
worker_info or model_switch, a model it was not told to load, more slots than its key allows) is closed
with a code, never a crash; an older worker and one its key does not allow are never told to switch."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from oasst_inference_server import metrics
from oasst_inference_server.broker import WorkerSession
from oasst_inference_server.domain_errors import NotFound
from oasst_inference_server.fleet.switcher import SwitchRefused
from oasst_inference_server.workers.key_limits import KeyLimits
from oasst_inference_server.workers.worker_connection import WorkerConnection
from oasst_shared.protocol import (
    CLOSE_KEY_FORBIDS,
    CLOSE_POLICY_VIOLATION,
    GeneratedText,
    ModelSwitch,
    Pong,
    WorkerInfo,
)
from tests.support.api import API, start_chat
from tests.support.worker_socket import (
    StandInSocket,
    switchable_connection,
    switchable_info,
    until,
)

pytestmark = API


def names(count: int) -> list[str]:
    tag = uuid.uuid4().hex[:6]
    return [f"switch-{tag}-{chr(ord('a') + i)}" for i in range(count)]


@asynccontextmanager
async def running(
    app: Any, info: WorkerInfo, socket: StandInSocket, **options: Any
) -> AsyncIterator[WorkerConnection]:
    connection = switchable_connection(app, info, socket, **options)
    task = asyncio.create_task(connection.run())
    try:
        await asyncio.wait_for(connection.commands_ready.wait(), 10)
        yield connection
    finally:
        socket.hang_up()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 10)


async def session_of(app: Any, session_id: str) -> WorkerSession | None:
    return (await app.state.registry.sessions.snapshot(fresh=True)).sessions.get(session_id)


def frames_of(socket: StandInSocket, kind: str) -> list[dict[str, Any]]:
    return [frame for frame in socket.sent if frame["type"] == kind]


def switches(model: str, outcome: str) -> float:
    labels = {"model": model, "outcome": outcome}
    return metrics.REGISTRY.get_sample_value("oasst_server_model_switches_total", labels) or 0.0


async def told_to_load(socket: StandInSocket, model: str) -> str:
    await until(lambda: any(f["model_config_name"] == model for f in frames_of(socket, "load_model")))
    return str(
        next(f for f in frames_of(socket, "load_model") if f["model_config_name"] == model)["request_id"]
    )


def report(socket: StandInSocket, request_id: str, model: str, *steps: str) -> None:
    for step in steps:
        progress = {"tensors_done": 2, "tensors_total": 5} if step == "quantizing" else {}
        socket.say(ModelSwitch(request_id=request_id, model_config_name=model, step=step, **progress))


async def test_a_switch_moves_the_session_and_the_next_job_of_the_new_model_goes_to_it(app, client, user):
    first, second = names(2)
    socket = StandInSocket()
    async with running(app, switchable_info(first, [first, second]), socket) as connection:
        ready_before = switches(second, "ready")
        assert (await app.state.registry.fleet_models())[second].loadable_count == 1
        await app.state.model_switcher.load(connection.session_id, second, "test")
        request_id = await told_to_load(socket, second)
        # Out of dispatch from the command on; the record says so to every replica.
        assert connection.capacity.free_slots == 0
        record = await session_of(app, connection.session_id)
        assert record is not None and record.switch is not None
        assert (record.switch.model_config_name, record.switch.from_model) == (second, first)
        assert record.serves is None and record.loaded  # still loaded with the first until it says
        report(socket, request_id, second, "draining", "unloading", "quantizing")

        async def quantizing() -> bool:
            record = await session_of(app, connection.session_id)
            return record is not None and record.switch is not None and record.switch.tensors_done == 2

        await until(quantizing)
        report(socket, request_id, second, "loading", "starting", "ready")
        socket.say(switchable_info(second, [first, second]))
        await until(lambda: connection.model_name == second)

        # The shared record is written after the connection's own state: other replicas see it a moment
        # later (a loaded machine showed the gap).
        async def recorded() -> bool:
            record = await session_of(app, connection.session_id)
            return record is not None and record.serves == second

        await until(recorded)
        record = await session_of(app, connection.session_id)
        assert record is not None and record.serves == second and record.switch is None
        assert record.last_switch is not None and record.last_switch.outcome == "ready"
        assert connection.session_id in app.state.dispatchers.for_model(second).workers
        assert connection.session_id not in app.state.dispatchers.for_model(first).workers
        assert switches(second, "ready") == ready_before + 1
        live = await app.state.registry.live_models()
        assert second in live and first not in live

        # The next answer asked of the new model goes to this worker, and completes.
        conversation = await start_chat(client, user, "Hi", model=second)
        await until(lambda: bool(frames_of(socket, "work")))
        work = frames_of(socket, "work")[0]
        assert (work["message_id"], work["model_config_name"]) == (conversation.assistant_id, second)
        socket.say(
            GeneratedText(
                message_id=work["message_id"], text="Hello.", finish_reason="eos_token", generated_tokens=2
            )
        )

        async def complete() -> bool:
            message = await app.state.lifecycle.get(work["message_id"])
            return message is not None and message.state == "complete"

        await until(complete)


async def test_a_job_in_flight_finishes_while_the_worker_drains_for_a_switch(app, client, user):
    first, second = names(2)
    socket = StandInSocket()
    async with running(app, switchable_info(first, [first, second]), socket) as connection:
        conversation = await start_chat(client, user, "Hi", model=first)
        await until(lambda: bool(frames_of(socket, "work")))
        await app.state.model_switcher.load(connection.session_id, second, "test")
        request_id = await told_to_load(socket, second)
        report(socket, request_id, second, "draining")
        # The answer in flight is not cut: it ends normally after the command.
        socket.say(
            GeneratedText(
                message_id=str(conversation.assistant_id),
                text="Done.",
                finish_reason="eos_token",
                generated_tokens=2,
            )
        )

        async def complete() -> bool:
            message = await app.state.lifecycle.get(str(conversation.assistant_id))
            return message is not None and message.state == "complete"

        await until(complete)
        assert connection.capacity.free_slots == 0  # and still nothing new until the switch ends
        report(socket, request_id, second, "unloading", "loading", "ready")
        socket.say(switchable_info(second, [first, second]))
        await until(lambda: connection.model_name == second and connection.capacity.free_slots == 1)


async def test_a_failed_load_leaves_the_worker_serving_its_previous_model(app):
    first, second = names(2)
    socket = StandInSocket()
    async with running(app, switchable_info(first, [first, second]), socket) as connection:
        failed_before = switches(second, "failed")
        await app.state.model_switcher.load(connection.session_id, second, "test")
        request_id = await told_to_load(socket, second)
        socket.say(
            ModelSwitch(request_id=request_id, model_config_name=second, step="failed", error="no memory")
        )
        socket.say(switchable_info(first, [first, second]))
        await until(lambda: connection.switch is None)
        assert connection.model_name == first and connection.capacity.free_slots == 1
        assert connection.session_id in app.state.dispatchers.for_model(first).workers
        assert connection.last_switch is not None
        assert (connection.last_switch.outcome, connection.last_switch.error) == ("failed", "no memory")
        assert switches(second, "failed") == failed_before + 1


async def test_an_unloaded_worker_serves_nothing_and_can_load_what_it_lists(app):
    first, second = names(2)
    socket = StandInSocket()
    async with running(app, switchable_info(first, [first, second]), socket) as connection:
        await app.state.model_switcher.unload(connection.session_id, "test")
        await until(lambda: bool(frames_of(socket, "unload_model")))
        request_id = frames_of(socket, "unload_model")[0]["request_id"]
        report(socket, request_id, first, "draining", "unloading", "ready")
        socket.say(switchable_info(first, [first, second], loaded=False))
        await until(lambda: not connection.loaded and connection.switch is None)
        assert connection.session_id not in app.state.dispatchers.for_model(first).workers
        assert first not in await app.state.registry.live_models()
        fleet = await app.state.registry.fleet_models()
        assert not fleet[first].loaded and fleet[first].loadable_count == 1
        assert fleet[second].loadable_count == 1
        with pytest.raises(SwitchRefused) as refused:
            await app.state.model_switcher.unload(connection.session_id, "test")
        assert refused.value.code == "already_unloaded"


@pytest.mark.parametrize(
    "lie",
    [
        "unasked worker_info",
        "unasked model_switch",
        "unlisted model",
        "other model's progress",
        "other request",
    ],
)
async def test_a_worker_that_lies_about_a_switch_is_closed(app, lie):
    first, second, third = names(3)
    socket = StandInSocket()
    async with running(app, switchable_info(first, [first, second, third]), socket) as connection:
        if lie == "unasked worker_info":
            socket.say(switchable_info(second, [first, second, third]))
        elif lie == "unasked model_switch":
            socket.say(ModelSwitch(request_id="sw-made-up", model_config_name=second, step="loading"))
        else:
            await app.state.model_switcher.load(connection.session_id, second, "test")
            request_id = await told_to_load(socket, second)
            if lie == "unlisted model":
                socket.say(switchable_info(third, [first, second, third]))  # told to load the second
            elif lie == "other model's progress":
                socket.say(ModelSwitch(request_id=request_id, model_config_name=third, step="loading"))
            else:
                socket.say(ModelSwitch(request_id="sw-other", model_config_name=second, step="loading"))
        await until(lambda: socket.closed_with is not None)
        assert socket.closed_with == CLOSE_POLICY_VIOLATION
        assert connection.model_name == first
    assert await session_of(app, connection.session_id) is None


async def test_a_worker_info_over_the_key_s_slots_after_a_switch_is_refused(app):
    first, second, third = names(3)
    socket = StandInSocket()
    limits = KeyLimits(max_slots=2, allowed_models=[first, second])
    info = switchable_info(first, [first, second, third])
    async with running(app, info, socket, key_limits=limits) as connection:
        # The key allows two of the three models it lists: the third is not offered to anyone.
        assert sorted(connection.servable) == [first, second]
        assert third not in await app.state.registry.fleet_models()
        with pytest.raises(SwitchRefused) as refused:
            await app.state.model_switcher.load(connection.session_id, third, "test")
        assert refused.value.code == "model_not_servable"
        await app.state.model_switcher.load(connection.session_id, second, "test")
        await told_to_load(socket, second)
        socket.say(switchable_info(second, [first, second], slots=3))
        await until(lambda: socket.closed_with is not None)
        assert socket.closed_with == CLOSE_KEY_FORBIDS


async def test_an_older_worker_is_never_told_to_switch(app):
    first, second = names(2)
    socket = StandInSocket()
    async with running(
        app, switchable_info(first, [first, second]), socket, protocol_version=5
    ) as connection:
        assert not connection.switchable and connection.servable == {}
        record = await session_of(app, connection.session_id)
        assert record is not None and not record.switchable and record.servable == []
        assert second not in await app.state.registry.fleet_models()
        with pytest.raises(SwitchRefused) as refused:
            await app.state.model_switcher.load(connection.session_id, second, "test")
        assert refused.value.code == "worker_cannot_switch"
        socket.say(switchable_info(second, [first, second]))  # a worker_info after the first
        await until(lambda: socket.closed_with is not None)
        assert socket.closed_with == CLOSE_POLICY_VIOLATION
    assert frames_of(socket, "load_model") == []


async def test_switch_commands_are_refused_with_clear_codes(app):
    first, second = names(2)
    with pytest.raises(NotFound) as unknown:
        await app.state.model_switcher.load("ws-nobody", first, "test")
    assert unknown.value.code == "unknown_worker_session"
    socket = StandInSocket()
    async with running(app, switchable_info(first, [first, second]), socket) as connection:
        with pytest.raises(SwitchRefused) as loaded:
            await app.state.model_switcher.load(connection.session_id, first, "test")
        assert loaded.value.code == "already_loaded"
        await app.state.model_switcher.load(connection.session_id, second, "test")
        with pytest.raises(SwitchRefused) as busy:
            await app.state.model_switcher.unload(connection.session_id, "test")
        assert busy.value.code == "worker_switching"
    assert len(frames_of(socket, "load_model")) == 1


async def test_a_switch_that_never_ends_closes_the_socket(app):
    first, second = names(2)
    settings = app.state.settings.model_copy(
        update={"model_switch_timeout": 0.5, "worker_ping_interval": 0.2}
    )
    socket = StandInSocket()
    async with running(app, switchable_info(first, [first, second]), socket, settings=settings) as connection:
        timeouts_before = switches(second, "timeout")
        await app.state.model_switcher.load(connection.session_id, second, "test")
        await until(lambda: socket.closed_with is not None)
    assert switches(second, "timeout") == timeouts_before + 1
    assert connection.switch is None


async def test_a_request_for_a_model_nobody_has_loaded_loads_it_on_an_unloaded_worker_first(
    app, client, user
):
    busy_model, wanted = names(2)
    loaded_socket, unloaded_socket = StandInSocket(), StandInSocket()
    loaded_info = switchable_info(busy_model, [busy_model, wanted])
    unloaded_info = switchable_info(busy_model, [busy_model, wanted], loaded=False)
    async with (
        running(app, loaded_info, loaded_socket),
        running(app, unloaded_info, unloaded_socket) as unloaded,
    ):
        fleet = await app.state.registry.fleet_models()
        assert not fleet[wanted].loaded and fleet[wanted].loadable_count == 2
        # Admitted and queued (not a 503), and a worker is told to load the model: the unloaded one.
        conversation = await start_chat(client, user, "Hi", model=wanted)
        request_id = await told_to_load(unloaded_socket, wanted)
        assert frames_of(loaded_socket, "load_model") == []
        message = await app.state.lifecycle.get(str(conversation.assistant_id))
        assert message is not None and message.state == "pending"
        assert await app.state.message_reads.model_loading(message)
        report(unloaded_socket, request_id, wanted, "loading", "ready")
        unloaded_socket.say(switchable_info(wanted, [busy_model, wanted]))
        await until(lambda: bool(frames_of(unloaded_socket, "work")))
        work = frames_of(unloaded_socket, "work")[0]
        assert work["message_id"] == conversation.assistant_id
        assert unloaded.model_name == wanted
        assert not await app.state.message_reads.model_loading(message)


async def test_a_model_s_last_busy_worker_is_not_taken_and_the_load_comes_when_it_is_free(app, client, user):
    busy_model, wanted = names(2)
    socket = StandInSocket()
    async with running(app, switchable_info(busy_model, [busy_model, wanted]), socket) as connection:
        running_answer = await start_chat(client, user, "Hi", model=busy_model)
        await until(lambda: bool(frames_of(socket, "work")))
        waiting = await start_chat(client, user, "Hi", model=wanted)
        loads = app.state.on_demand_loads
        # Its only worker runs the other model's last job: no load, the request waits in the queue.
        assert await loads.ensure(wanted) is None
        await asyncio.sleep(0.3)  # the attempt of the request's own submission, too, ends without a load
        assert frames_of(socket, "load_model") == []
        message = await app.state.lifecycle.get(str(waiting.assistant_id))
        assert message is not None and message.state == "pending"
        assert await app.state.message_reads.model_loading(message)
        socket.say(
            GeneratedText(
                message_id=str(running_answer.assistant_id),
                text="Done.",
                finish_reason="eos_token",
                generated_tokens=2,
            )
        )
        await until(lambda: connection.capacity.in_flight == 0)
        socket.say(Pong(ping_id="p", free_slots=1))  # its next pong tells every replica it is idle

        async def idle() -> bool:
            record = await session_of(app, connection.session_id)
            return record is not None and not record.in_flight

        await until(idle)
        await loads.tick()  # the fleet pass tries again for the model with queued work
        request_id = await told_to_load(socket, wanted)
        report(socket, request_id, wanted, "ready")
        socket.say(switchable_info(wanted, [busy_model, wanted]))
        await until(lambda: any(f["message_id"] == waiting.assistant_id for f in frames_of(socket, "work")))
