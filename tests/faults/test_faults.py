"""Every fault injected against the real Postgres and Redis; each test checks nothing is lost.

The fake backend (tests/support/fake_backend.py) scripts errors, stalls and drops; the worker-kill test uses the
real CPU backend with SmolLM2.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import threading
import time
import uuid

import pytest
import redis
from websockets.asyncio.client import connect

from oasst_shared.model_configs import SMOLLM2_135M
from oasst_shared.protocol import PROTOCOL_VERSION, Drain, WorkerInfo, dump_frame
from tests.e2e.chat_api import ChatApi, tokens_text
from tests.support.fake_workers import fake_model, start_fake_worker
from tests.support.fault_flows import final_of, new_api, queue, start_redis, wait_state
from tests.support.processes import free_port, start_process, wait_for_model
from tests.support.stacks import WORKER_API_KEY, start_replicas

pytestmark = pytest.mark.slow


STORY = "Write a long story about a brave knight."


def test_a_greedy_answer_whose_worker_is_killed_twice_is_continued_to_the_uninterrupted_answer(
    fault_stack, cpu_backend
):
    """Chat readers see no restart: the tokens before each kill stay, the next worker goes on from them,
    and the answer (text and token count) is the one no kill interrupted."""
    workers = [fault_stack.start_worker()]
    wait_for_model(fault_stack.url, SMOLLM2_135M.name)
    api = new_api(fault_stack)
    chat_id, reference_id = queue(api, SMOLLM2_135M.name, STORY, do_sample=False, max_new_tokens=400)
    reference = final_of(api.events(chat_id, reference_id))["message"]
    assert reference["generated_tokens"] >= 300, reference  # long enough to be cut twice

    chat_id, message_id = queue(api, SMOLLM2_135M.name, STORY, do_sample=False, max_new_tokens=400)
    seen: list = []
    kills = 0
    standby = False  # the next worker is connected: the one generating is killed at its next token
    with contextlib.closing(api.follow(chat_id, message_id)) as events:
        for event in events:
            seen.append(event)
            if event.data["event_type"] != "token" or kills == 2:
                continue
            if standby:
                workers[-2].kill()  # SIGKILL, mid-answer
                kills += 1
                standby = False
            elif sum(e.data["event_type"] == "continuation" for e in seen) == kills:
                # The newest worker streams the answer (after its continuation): the next one connects.
                workers.append(fault_stack.start_worker())
                wait_for_model(fault_stack.url, SMOLLM2_135M.name, workers=2)
                standby = True

    final = final_of(seen)
    assert final["event_type"] == "message", final
    message = final["message"]
    kinds = [e.data["event_type"] for e in seen]
    assert "retry" not in kinds and kinds.count("continuation") == 2
    assert message["state"] == "complete" and message["attempts"] == 3
    assert message["content"] == reference["content"]
    assert message["generated_tokens"] == reference["generated_tokens"]
    assert tokens_text(seen) == message["content"]  # what readers got is the answer, nothing twice
    workers[-1].stop()


def test_a_constrained_answer_whose_worker_is_killed_starts_over(fault_stack, cpu_backend):
    """A JSON-schema answer cannot be continued (the grammar's state is lost): it is regenerated, and
    readers are told to drop the text so far."""
    first = fault_stack.start_worker()
    wait_for_model(fault_stack.url, SMOLLM2_135M.name)
    api = new_api(fault_stack)
    schema = {
        "type": "object",
        "properties": {"numbers": {"type": "array", "items": {"type": "integer"}, "minItems": 300}},
        "required": ["numbers"],
    }
    format_ = {"type": "json_schema", "json_schema": {"name": "count", "schema": schema}}
    chat_id, message_id = queue(
        api,
        SMOLLM2_135M.name,
        "Count from 1 to 300.",
        do_sample=False,
        max_new_tokens=200,
        response_format=format_,
    )
    seen: list = []
    second = None
    with contextlib.closing(api.follow(chat_id, message_id)) as events:
        for event in events:
            seen.append(event)
            if event.data["event_type"] == "token" and second is None:
                second = fault_stack.start_worker()
                wait_for_model(fault_stack.url, SMOLLM2_135M.name, workers=2)
                first.kill()  # mid-answer: 200 tokens take seconds
    final = final_of(seen)
    assert final["event_type"] == "message", final
    message = final["message"]
    assert message["state"] == "complete" and message["attempts"] == 2
    kinds = [e.data["event_type"] for e in seen]
    assert kinds.count("retry") == 1 and "continuation" not in kinds
    # After the retry event, the tokens spell exactly the final answer, the schema's JSON from its start.
    assert tokens_text(seen) == message["content"] and message["content"].lstrip().startswith("{")
    assert second is not None
    second.stop()


async def test_a_silent_worker_loses_its_lease_and_the_message_moves_on(fault_stack, fake_backend):
    model = fake_model()
    api = new_api(fault_stack)
    headers = {"X-API-Key": WORKER_API_KEY, "X-Protocol-Version": str(PROTOCOL_VERSION)}
    async with connect(f"{fault_stack.ws_url}/workers/work", additional_headers=headers) as silent:
        await silent.send(
            dump_frame(WorkerInfo(model_config=model, max_parallel_requests=1, backend_kind="fake"))
        )
        await asyncio.to_thread(wait_for_model, fault_stack.url, model.name)
        chat_id, message_id = await asyncio.to_thread(queue, api, model.name, "hello", max_new_tokens=5)
        while True:  # the silent worker gets the job, then answers nothing at all
            frame = json.loads(await asyncio.wait_for(silent.recv(), 10))
            if frame["type"] == "work":
                assert frame["message_id"] == message_id
                break
        healthy = await asyncio.to_thread(start_fake_worker, fault_stack, fake_backend, model)
        message = await asyncio.to_thread(wait_state, api, chat_id, message_id, {"complete", "failed"}, 30)
        assert message["state"] == "complete" and message["attempts"] == 2
        assert message["content"] == " w1 w2 w3 w4 w5"
    healthy.stop()


class DrainingWorker:
    """A raw protocol worker that registers a model and takes no work (it drains at once)."""

    def __init__(self, stack, model):
        self.stack, self.model = stack, model

    async def __aenter__(self):
        headers = {"X-API-Key": WORKER_API_KEY, "X-Protocol-Version": str(PROTOCOL_VERSION)}
        self.ws = await connect(f"{self.stack.ws_url}/workers/work", additional_headers=headers)
        info = WorkerInfo(model_config=self.model, max_parallel_requests=1, backend_kind="fake")
        await self.ws.send(dump_frame(info))
        await self.ws.send(dump_frame(Drain()))
        await asyncio.to_thread(wait_for_model, self.stack.url, self.model.name)
        return self

    async def __aexit__(self, *exc_info):
        await self.ws.close()


@pytest.mark.parametrize("fault", ["flush", "restart"])
async def test_redis_flush_or_restart_loses_no_pending_message(
    fault, cpu_backend, postgres_url, tmp_path, fake_backend
):
    from tests.support.fake_workers import FAST_TIMINGS
    from tests.support.stacks import start_stack

    # A Redis of our own, so flushing and restarting it touches nothing else.
    port = free_port()
    redis_proc = start_redis(port)
    timings = {**FAST_TIMINGS, "OASST_SERVER_NO_WORKER_TIMEOUT": "60"}
    stack = await asyncio.to_thread(
        start_stack, tmp_path, cpu_backend.url, postgres_url, f"redis://127.0.0.1:{port}/0", 0, **timings
    )
    try:
        model = fake_model()
        api = new_api(stack)
        async with DrainingWorker(stack, model):
            pending = [
                await asyncio.to_thread(queue, api, model.name, f"question {i}", max_new_tokens=4)
                for i in range(3)
            ]
        if fault == "flush":
            redis.Redis(port=port).flushall()
        else:
            redis_proc.terminate()
            redis_proc.wait(10)
            await asyncio.sleep(1.0)
            redis_proc = start_redis(port)
        await asyncio.to_thread(start_fake_worker, stack, fake_backend, model)
        for chat_id, message_id in pending:
            message = await asyncio.to_thread(
                wait_state, api, chat_id, message_id, {"complete", "failed"}, 30
            )
            assert message["state"] == "complete" and message["content"] == " w1 w2 w3 w4"
    finally:
        stack.stop()
        redis_proc.terminate()
        redis_proc.wait(10)


def test_cancel_closes_the_backend_stream_and_keeps_the_partial_text(fault_stack, fake_backend):
    model = fake_model()
    worker = start_fake_worker(fault_stack, fake_backend, model)
    api = new_api(fault_stack)
    chat_id, message_id = queue(api, model.name, "[[slow]] go", max_new_tokens=400)
    seen = api.events(chat_id, message_id, limit=6)
    assert sum(e.data["event_type"] == "token" for e in seen) >= 3
    before = fake_backend.stats()
    cancelled_at = time.monotonic()
    response = api.client.post(f"/chats/{chat_id}/messages/{message_id}/cancel")
    assert response.status_code == 200
    while fake_backend.stats()["disconnected"] == before["disconnected"]:
        assert time.monotonic() - cancelled_at < 1.0, "the backend stream was not closed within a second"
        time.sleep(0.02)
    message = wait_state(api, chat_id, message_id, {"cancelled", "complete", "failed"}, 10)
    assert message["state"] == "cancelled"
    assert message["content"].startswith(" w1 w2 w3") and len(message["content"].split()) < 400
    final = final_of(api.events(chat_id, message_id))
    assert final["event_type"] == "message" and final["message"]["state"] == "cancelled"
    worker.stop()


def test_cancel_while_pending_ends_at_once(fault_stack, fake_backend):
    model = fake_model()

    async def scenario():
        async with DrainingWorker(fault_stack, model):
            api = new_api(fault_stack)
            chat_id, message_id = await asyncio.to_thread(queue, api, model.name, "hello")
            response = await asyncio.to_thread(
                api.client.post, f"/chats/{chat_id}/messages/{message_id}/cancel"
            )
            assert response.json()["state"] == "cancelled"
            events = await asyncio.to_thread(api.events, chat_id, message_id)
            assert final_of(events)["message"]["state"] == "cancelled"

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("marker", "state", "attempts"),
    [
        ("[[invalid]]", "refused", 1),
        ("[[error]]", "aborted_by_worker", 1),
        ("[[stall]]", "aborted_by_worker", 3),
        ("[[drop]]", "aborted_by_worker", 3),
        ("[[busy]]", "aborted_by_worker", 3),
    ],
)
def test_backend_faults_fail_or_retry_one_message_and_spare_the_others(
    fault_stack, fake_backend, marker, state, attempts
):
    model = fake_model()
    worker = start_fake_worker(fault_stack, fake_backend, model, OASST_WORKER_MAX_PARALLEL_REQUESTS="3")
    api = new_api(fault_stack)
    bystander = queue(api, model.name, "[[slow]] keep going", max_new_tokens=60)
    faulty = queue(api, model.name, f"{marker} please", max_new_tokens=20)
    final = final_of(api.events(*faulty))
    assert final["event_type"] == "error" and final["error"]
    assert final["message"]["state"] == state and final["message"]["attempts"] == attempts
    # The worker's other in-flight message completes untouched.
    other = final_of(api.events(*bystander))
    assert other["event_type"] == "message" and other["message"]["state"] == "complete"
    assert other["message"]["content"] == "".join(f" w{i}" for i in range(1, 61))
    assert other["message"]["attempts"] == 1
    assert worker.alive()
    worker.stop()


def test_an_answer_completes_when_the_backend_keeps_its_response_open_after_the_last_event(
    fault_stack, fake_backend
):
    # The worker reads a TGI response to its end to pool the connection; one that never ends costs
    # the connection (closed after a short wait), not the answer.
    model = fake_model()
    worker = start_fake_worker(fault_stack, fake_backend, model)
    api = new_api(fault_stack)
    for _ in range(2):
        final = final_of(api.events(*queue(api, model.name, "[[linger]] answer", max_new_tokens=5)))
        assert final["event_type"] == "message" and final["message"]["state"] == "complete"
        assert final["message"]["content"] == "".join(f" w{i}" for i in range(1, 6))
        assert final["message"]["attempts"] == 1
    worker.stop()


def test_a_model_with_no_worker_fails_with_a_clear_error(fault_stack):
    model = fake_model()

    async def scenario():
        api = new_api(fault_stack)
        async with DrainingWorker(fault_stack, model):
            chat_id, message_id = await asyncio.to_thread(queue, api, model.name, "anyone there?")
        started = time.monotonic()
        events = await asyncio.to_thread(api.events, chat_id, message_id)
        final = final_of(events)
        assert final["event_type"] == "error" and model.name in final["error"]
        assert final["message"]["state"] == "failed"
        assert any(e.data["event_type"] == "pending" for e in events)
        assert time.monotonic() - started < 30

    asyncio.run(scenario())


def test_sigterm_drains_a_worker(fault_stack, fake_backend):
    model = fake_model()
    worker = start_fake_worker(fault_stack, fake_backend, model, OASST_WORKER_MAX_PARALLEL_REQUESTS="1")
    api = new_api(fault_stack)
    running = queue(api, model.name, "[[slow]] finish me", max_new_tokens=40)
    api.events(*running, limit=3)
    worker.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    waiting = queue(api, model.name, "not for the draining worker", max_new_tokens=3)
    assert worker.proc.wait(timeout=30) == 0
    done = final_of(api.events(*running))
    assert done["message"]["state"] == "complete" and done["message"]["attempts"] == 1
    assert len(done["message"]["content"].split()) == 40
    # The draining worker took nothing new: the second message waits for another worker.
    assert api.client.get(f"/chats/{waiting[0]}/messages/{waiting[1]}").json()["state"] == "pending"
    start_fake_worker(fault_stack, fake_backend, model)
    assert final_of(api.events(*waiting))["message"]["state"] == "complete"


def test_several_readers_each_get_every_event(fault_stack, fake_backend):
    model = fake_model()
    worker = start_fake_worker(fault_stack, fake_backend, model)
    api = new_api(fault_stack)
    chat_id, message_id = queue(api, model.name, "[[slow]] for everyone", max_new_tokens=30)
    results: list[list] = [[], [], []]

    def read(i: int) -> None:
        results[i] = [e for e in api.events(chat_id, message_id) if e.id]

    threads = [threading.Thread(target=read, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results[0] and all([e.id for e in r] == [e.id for e in results[0]] for r in results)
    assert tokens_text(results[0]) == "".join(f" w{i}" for i in range(1, 31))
    worker.stop()


def test_queue_position_follows_the_database(fault_stack):
    model = fake_model()

    async def scenario():
        api = new_api(fault_stack)
        async with DrainingWorker(fault_stack, model):
            queued = [await asyncio.to_thread(queue, api, model.name, f"q{i}") for i in range(3)]

            def first_pending(chat_id, message_id):
                return next(e.data for e in api.events(chat_id, message_id, limit=1))

            positions = [await asyncio.to_thread(first_pending, *q) for q in queued]
            assert [(p["queue_position"], p["queue_size"]) for p in positions] == [(1, 3), (2, 3), (3, 3)]
            await asyncio.to_thread(api.client.post, f"/chats/{queued[0][0]}/messages/{queued[0][1]}/cancel")
            after = await asyncio.to_thread(first_pending, *queued[2])
            assert (after["queue_position"], after["queue_size"]) == (2, 2)
            for q in queued[1:]:
                await asyncio.to_thread(api.client.post, f"/chats/{q[0]}/messages/{q[1]}/cancel")

    asyncio.run(scenario())


@pytest.mark.parametrize("how", ["kill", "sigterm"])
def test_a_lost_replica_s_reader_resumes_on_another(how, cpu_backend, postgres_url, redis_prefix, tmp_path):
    from tests.support.fake_workers import FAST_TIMINGS

    prefix = f"{redis_prefix}replicas:{uuid.uuid4().hex[:6]}:"
    (url_a, server_a), (url_b, server_b) = start_replicas(tmp_path, postgres_url, prefix, **FAST_TIMINGS)
    worker = start_process(
        "worker",
        "oasst_worker",
        {
            "OASST_WORKER_SERVER_URL": url_a.replace("http", "ws"),
            "OASST_WORKER_API_KEY": WORKER_API_KEY,
            "OASST_WORKER_BACKEND_URL": cpu_backend.url,
        },
        tmp_path,
    )
    try:
        wait_for_model(url_b, SMOLLM2_135M.name)
        api_b = ChatApi(url_b, f"user-{uuid.uuid4().hex[:8]}")
        chat_id, message_id = queue(
            api_b, SMOLLM2_135M.name, "Tell me about the sea.", do_sample=False, max_new_tokens=120
        )
        first = api_b.events(chat_id, message_id, limit=5)
        if how == "kill":
            server_b.kill()
        else:  # a graceful stop: streams end with a reconnectable close
            server_b.stop()
        api_a = ChatApi(url_a, api_b.username)
        api_a.client.headers["Authorization"] = f"Bearer {api_b.token}"
        rest = api_a.events(chat_id, message_id, last_event_id=[e.id for e in first if e.id][-1])
        final = final_of(rest)
        assert final["event_type"] == "message" and final["message"]["state"] == "complete"
        stored = [e for e in first + rest if e.id]
        assert len({e.id for e in stored}) == len(stored), "an event arrived twice"
        assert tokens_text(first + rest) == final["message"]["content"]
        # The whole stream read once more from the surviving replica matches, with no gap.
        again = [e for e in api_a.events(chat_id, message_id) if e.id]
        assert [e.id for e in again] == [e.id for e in stored]
    finally:
        worker.stop()
        server_a.stop()
        server_b.stop()


def test_a_worker_whose_backend_is_down_takes_no_work_until_it_is_back(fault_stack, tmp_path):
    from tests.support.fake_workers import FakeBackend, start_fake_backend

    port = free_port()

    def start_backend() -> FakeBackend:
        return start_fake_backend(tmp_path, port)

    backend = start_backend()
    model = fake_model()
    worker = start_fake_worker(fault_stack, backend, model, OASST_WORKER_BACKEND_HEALTH_INTERVAL="0.3")
    backend.process.stop()
    time.sleep(1.5)  # the worker notices and reports zero capacity
    api = new_api(fault_stack)
    chat_id, message_id = queue(api, model.name, "are you there?", max_new_tokens=3)
    time.sleep(2.0)
    message = api.client.get(f"/chats/{chat_id}/messages/{message_id}").json()
    assert message["state"] == "pending" and message["attempts"] == 0, (
        "work was given to a worker without a backend"
    )
    backend = start_backend()
    message = wait_state(api, chat_id, message_id, {"complete", "failed", "aborted_by_worker"}, 30)
    assert message["state"] == "complete" and message["attempts"] == 1
    worker.stop()
    backend.process.stop()
