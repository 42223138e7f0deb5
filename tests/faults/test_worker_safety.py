"""Worker-socket safety: a poison message fails alone, backend refusals spend no attempt,
every in_progress has a time bound, and a cancel reaches the worker even when its command is lost.

Real Postgres and Redis; the scripted fake backend injects the faults, and raw protocol workers
play the misbehaving worker where the fault is the worker's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from oasst_inference_server.workers.worker_frames import USAGE_SLACK_TOKENS
from oasst_shared.protocol import (
    PROTOCOL_VERSION,
    GeneratedText,
    Pong,
    Token,
    TokenBatch,
    WorkerInfo,
    dump_frame,
)
from tests.e2e.chat_api import ChatApi
from tests.support.api import ADMIN_TOKEN
from tests.support.fake_workers import (
    FAST_TIMINGS,
    FakeBackend,
    fake_model,
    start_fake_backend,
    start_fake_worker,
)
from tests.support.fault_flows import final_of, new_api, queue, wait_state
from tests.support.processes import ManagedProcess, free_port, wait_for_model
from tests.support.services import REDIS_URL, fresh_database
from tests.support.stacks import WORKER_API_KEY, Stack, start_replicas, start_stack

pytestmark = pytest.mark.slow

# A short in-progress bound: grace + max_new_tokens / rate = 2 s + 5 tokens / 5 per s = 3 s.
SAFETY_TIMINGS = {
    **FAST_TIMINGS,
    "OASST_SERVER_IN_PROGRESS_GRACE": "2",
    "OASST_SERVER_MIN_GENERATION_RATE": "5",
    "OASST_SERVER_MAX_BACKEND_REFUSALS": "50",
}


@pytest.fixture(scope="module")
def safety_database() -> Iterator[str]:
    # A database of its own: the recovery loop of any stack on a shared database would act on these
    # tests' expired messages too, and announce their retries on its own broker.
    with fresh_database("oasst_safety") as url:
        yield url


@pytest.fixture(scope="module")
def safety_stack(
    cpu_backend, safety_database: str, redis_prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    log_dir = tmp_path_factory.mktemp("safety-stack")
    stack = start_stack(
        log_dir,
        cpu_backend.url,
        safety_database,
        REDIS_URL,
        workers=0,
        OASST_SERVER_REDIS_KEY_PREFIX=f"{redis_prefix}safety:{uuid.uuid4().hex[:6]}:",
        OASST_SERVER_ADMIN_ROOT_TOKEN=ADMIN_TOKEN,
        **SAFETY_TIMINGS,
    )
    yield stack
    stack.stop()


def event_types(events) -> list[str]:
    return [e.data["event_type"] for e in events]


class RawWorker:
    """A protocol-level worker the test drives by hand. A background task answers every ping (so the
    server never drops it for silence, however slow the machine) and queues the other frames."""

    def __init__(self, stack: Stack, model, *, slots: int = 1):
        self.stack, self.model, self.slots = stack, model, slots
        self.frames: asyncio.Queue[dict] = asyncio.Queue()
        self.jobs = 0  # work frames received: each keeps a slot (the tests finish jobs by hand, if at all)

    async def __aenter__(self) -> RawWorker:
        headers = {"X-API-Key": WORKER_API_KEY, "X-Protocol-Version": str(PROTOCOL_VERSION)}
        self.ws = await connect(f"{self.stack.ws_url}/workers/work", additional_headers=headers)
        info = WorkerInfo(model_config=self.model, max_parallel_requests=self.slots, backend_kind="fake")
        await self.ws.send(dump_frame(info))
        self._reader = asyncio.create_task(self._read())
        await asyncio.to_thread(wait_for_model, self.stack.url, self.model.name)
        return self

    async def __aexit__(self, *exc) -> None:
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
        await self.ws.close()

    async def _read(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for raw in self.ws:
                frame = json.loads(raw)
                if frame["type"] == "ping":
                    free = max(0, self.slots - self.jobs)  # what it has free, as a real worker reports
                    await self.ws.send(dump_frame(Pong(ping_id=frame["ping_id"], free_slots=free)))
                else:
                    self.jobs += frame["type"] == "work"
                    await self.frames.put(frame)

    async def next_frame(self, wanted: str, timeout: float = 30) -> dict:
        """The next frame of type ``wanted`` (others before it are dropped)."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                frame = await asyncio.wait_for(self.frames.get(), left)
            except asyncio.TimeoutError:
                break
            if frame["type"] == wanted:
                return frame
        raise AssertionError(f"no {wanted} frame within {timeout}s")

    async def received_for(self, seconds: float) -> list[dict]:
        """The frames (pings aside) received within ``seconds``."""
        await asyncio.sleep(seconds)
        frames = []
        while not self.frames.empty():
            frames.append(self.frames.get_nowait())
        return frames


@pytest.mark.parametrize("marker", ["[[nul]]", "[[huge]]"], ids=["invalid-text", "over-frame-limit"])
def test_a_poison_answer_fails_alone_and_another_user_s_answer_is_untouched(
    safety_stack, fake_backend, marker
):
    model = fake_model()
    worker = start_fake_worker(safety_stack, fake_backend, model, OASST_WORKER_MAX_PARALLEL_REQUESTS="3")
    bystander_api, poison_api = new_api(safety_stack), new_api(safety_stack)
    bystander = queue(bystander_api, model.name, "[[slow]] keep going", max_new_tokens=60)
    poison = queue(poison_api, model.name, f"{marker} please", max_new_tokens=600)
    final = final_of(poison_api.events(*poison))
    assert final["event_type"] == "error", final
    assert final["message"]["state"] == "aborted_by_worker" and final["message"]["attempts"] == 1
    assert "NUL" in final["error"] if marker == "[[nul]]" else "frame" in final["error"], final["error"]
    # Same worker, same time, another user: no retry, every token, one attempt.
    events = bystander_api.events(*bystander)
    assert "retry" not in event_types(events)
    other = final_of(events)
    assert other["event_type"] == "message" and other["message"]["state"] == "complete"
    assert other["message"]["content"] == "".join(f" w{i}" for i in range(1, 61))
    assert other["message"]["attempts"] == 1
    assert worker.alive()
    # The worker's socket was never closed: it is the same process, serving the next message.
    after = queue(bystander_api, model.name, "and one more", max_new_tokens=3)
    assert final_of(bystander_api.events(*after))["message"]["content"] == " w1 w2 w3"
    worker.stop()


def test_a_backend_down_for_a_few_seconds_leaves_answers_pending_until_it_is_back(safety_stack, tmp_path):
    port = free_port()

    def start_backend() -> FakeBackend:
        return start_fake_backend(tmp_path, port=port)

    backend = start_backend()
    model = fake_model()
    # A slow health check: work reaches the worker before it notices, and the backend refuses it.
    worker = start_fake_worker(
        safety_stack,
        backend,
        model,
        OASST_WORKER_BACKEND_HEALTH_INTERVAL="3",
        OASST_WORKER_MAX_PARALLEL_REQUESTS="2",
    )
    backend.process.kill()
    api = new_api(safety_stack)
    queued = [queue(api, model.name, f"question {i}", max_new_tokens=3) for i in range(4)]
    time.sleep(4.0)
    for chat_id, message_id in queued:
        message = api.client.get(f"/chats/{chat_id}/messages/{message_id}").json()
        assert message["state"] in ("pending", "in_progress") and message["attempts"] <= 1, message
    assert any(api.client.get(f"/chats/{c}/messages/{m}").json()["state"] == "pending" for c, m in queued)
    backend = start_backend()
    try:
        for chat_id, message_id in queued:
            message = wait_state(api, chat_id, message_id, {"complete", "failed", "aborted_by_worker"}, 60)
            assert message["state"] == "complete" and message["attempts"] == 1, message
            assert message["content"] == " w1 w2 w3"
            assert "retry" not in event_types(api.events(chat_id, message_id))
        assert worker.alive()
    finally:
        worker.stop()
        backend.process.stop()


def test_a_worker_that_pings_but_never_finishes_loses_the_message_within_the_bound(
    safety_stack, fake_backend
):
    model = fake_model()
    api = new_api(safety_stack)

    async def scenario() -> None:
        async with RawWorker(safety_stack, model) as zombie:
            chat_id, message_id = await asyncio.to_thread(queue, api, model.name, "hello", max_new_tokens=5)
            work = await zombie.next_frame("work")
            assert work["message_id"] == message_id
            await zombie.ws.send(dump_frame(Token(message_id=message_id, text=" z")))
            healthy = await asyncio.to_thread(start_fake_worker, safety_stack, fake_backend, model)
            try:
                # The zombie keeps answering pings (so its lease never runs out) but never finishes.
                message = await asyncio.to_thread(
                    wait_state, api, chat_id, message_id, {"complete", "failed", "aborted_by_worker"}, 60
                )
                assert message["state"] == "complete" and message["attempts"] == 2
                # The zombie's token is kept and continued: the budget of 5 less its one token.
                assert message["content"] == " z w1 w2 w3 w4"
                events = await asyncio.to_thread(api.events, chat_id, message_id)
                kinds = [e.data["event_type"] for e in events]
                continued = [e.data for e in events if e.data["event_type"] == "continuation"]
                assert "retry" not in kinds and len(continued) == 1
                assert "in-progress bound" in continued[0]["reason"]
            finally:
                healthy.stop()

    asyncio.run(scenario())


def test_a_lost_cancel_is_sent_again_and_a_late_result_still_ends_cancelled(safety_stack):
    model = fake_model()
    api = new_api(safety_stack)

    async def scenario() -> None:
        async with RawWorker(safety_stack, model) as worker:
            chat_id, message_id = await asyncio.to_thread(
                queue, api, model.name, "a long one", max_new_tokens=500
            )
            await worker.next_frame("work")
            await worker.ws.send(dump_frame(Token(message_id=message_id, text=" partial")))
            cancel = await asyncio.to_thread(
                api.client.post, f"/chats/{chat_id}/messages/{message_id}/cancel"
            )
            assert cancel.status_code < 300, cancel.text
            # The worker "loses" the first cancel; the server sends it again with the next pongs.
            first = await worker.next_frame("cancel")
            assert first["message_id"] == message_id
            again = await worker.next_frame("cancel", timeout=10)
            assert again["message_id"] == message_id
            # A worker that finishes regardless: the pending cancel still wins.
            await worker.ws.send(
                dump_frame(
                    GeneratedText(
                        message_id=message_id,
                        text=" partial answer",
                        finish_reason="length",
                        generated_tokens=2,
                    )
                )
            )
            message = await asyncio.to_thread(
                wait_state, api, chat_id, message_id, {"cancelled", "complete"}, 20
            )
            assert message["state"] == "cancelled" and message["content"] == " partial answer"
            # Acknowledged: no more cancels.
            await worker.received_for(0)  # what was sent before the result
            later = await worker.received_for(2.0)
            assert not [f for f in later if f["type"] == "cancel"]

    asyncio.run(scenario())


def test_a_worker_cannot_stream_more_tokens_than_the_job_allows(safety_stack):
    model = fake_model()
    api = new_api(safety_stack)

    async def scenario() -> None:
        async with RawWorker(safety_stack, model) as worker:
            chat_id, message_id = await asyncio.to_thread(queue, api, model.name, "hi", max_new_tokens=5)
            await worker.next_frame("work")
            for _ in range(10):  # 1,000 token frames for a job of 5 new tokens
                batch = TokenBatch(tokens=[Token(message_id=message_id, text="x") for _ in range(100)])
                await worker.ws.send(dump_frame(batch))
            done = GeneratedText(
                message_id=message_id, text="xxxxx", finish_reason="length", generated_tokens=5
            )
            await worker.ws.send(dump_frame(done))
            await asyncio.to_thread(wait_state, api, chat_id, message_id, {"complete"}, 20)
            events = await asyncio.to_thread(api.events, chat_id, message_id)
            tokens = [e for e in events if e.data["event_type"] == "token"]
            assert len(tokens) == 5 + USAGE_SLACK_TOKENS, len(tokens)  # the rest were dropped
            assert final_of(events)["message"]["content"] == "xxxxx"

    asyncio.run(scenario())


def test_usage_is_bounded_by_what_the_server_saw(safety_stack):
    model = fake_model()
    api = new_api(safety_stack)

    async def scenario() -> None:
        async with RawWorker(safety_stack, model) as worker:
            chat_id, message_id = await asyncio.to_thread(queue, api, model.name, "hi", max_new_tokens=50)
            await worker.next_frame("work")
            await worker.ws.send(dump_frame(Token(message_id=message_id, text=" ok")))
            forged = GeneratedText(
                message_id=message_id,
                text=" ok",
                finish_reason="eos_token",
                generated_tokens=1_000_000,
                prompt_tokens=5_000_000,
            )
            await worker.ws.send(dump_frame(forged))
            message = await asyncio.to_thread(wait_state, api, chat_id, message_id, {"complete"}, 20)
            assert message["generated_tokens"] <= 50
            assert message["prompt_tokens"] < 1000
            # The lie itself is caught by the server's own count: a failed compliance check of the worker.
            checks = httpx.get(
                f"{safety_stack.url}/admin/compliance_checks",
                params={"outcome": "failed"},
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                timeout=10,
            ).json()
            caught = [c for c in checks if c["kind"] == "usage" and message_id in c["detail"]]
            assert len(caught) == 1, checks
            assert "claimed 1000000 generated tokens" in caught[0]["detail"]

        async with RawWorker(safety_stack, model) as worker:
            # An honest count (within the slack of tokens that leave no text) is no failure.
            chat_id, message_id = await asyncio.to_thread(queue, api, model.name, "hi", max_new_tokens=50)
            await worker.next_frame("work")
            await worker.ws.send(dump_frame(Token(message_id=message_id, text=" ok")))
            honest = forged.model_copy(update={"message_id": message_id, "generated_tokens": 3})
            await worker.ws.send(dump_frame(honest))
            await asyncio.to_thread(wait_state, api, chat_id, message_id, {"complete"}, 20)
            checks = httpx.get(
                f"{safety_stack.url}/admin/compliance_checks",
                params={"outcome": "failed"},
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                timeout=10,
            ).json()
            assert not [c for c in checks if message_id in c["detail"]]

    asyncio.run(scenario())


def test_when_the_replica_holding_the_socket_dies_the_lease_expires_and_another_replica_retries(
    cpu_backend, redis_prefix, tmp_path, fake_backend
):
    """Replica A holds the worker's socket and dies (SIGKILL): nothing on A can release the message.
    Its lease runs out, replica B's recovery loop sends it on with the text readers had, and a worker on B
    continues it."""
    prefix = f"{redis_prefix}lease:{uuid.uuid4().hex[:6]}:"
    with fresh_database("oasst_lease") as database_url:
        _lease_scenario(database_url, prefix, tmp_path, fake_backend)


def first_token(api: ChatApi, chat_id: str, message_id: str) -> None:
    """Return once the message's stream holds a token (its first events may be pending ones)."""
    seen: list = []
    while not any(e.data["event_type"] == "token" for e in seen):
        last = seen[-1].id if seen else None
        seen += api.events(chat_id, message_id, last, 1)


def _lease_scenario(database_url: str, prefix: str, tmp_path: Path, fake_backend: FakeBackend) -> None:
    (url_a, server_a), (url_b, server_b) = start_replicas(tmp_path, database_url, prefix, **FAST_TIMINGS)
    stack_a = _stack(url_a, server_a, tmp_path, fake_backend)
    stack_b = _stack(url_b, server_b, tmp_path, fake_backend)
    model = fake_model()
    api = ChatApi(url_b, f"user-{uuid.uuid4().hex[:8]}")

    async def scenario() -> None:
        async with RawWorker(stack_a, model) as held:
            chat_id, message_id = await asyncio.to_thread(queue, api, model.name, "hello", max_new_tokens=4)
            assert (await held.next_frame("work"))["message_id"] == message_id
            # The work is sent while the claim commits: kill A only once the claim holds (a replica
            # killed before its claim commits leaves the message pending, and it is simply re-queued).
            await asyncio.to_thread(wait_state, api, chat_id, message_id, {"in_progress"}, 10)
            await held.ws.send(dump_frame(Token(message_id=message_id, text=" partial")))
            # Once readers have the token (it is in the broker), the socket's replica dies.
            await asyncio.to_thread(first_token, api, chat_id, message_id)
            server_a.kill()  # the socket's replica is gone: no cleanup runs anywhere
        rescuer = await asyncio.to_thread(start_fake_worker, stack_b, fake_backend, model)
        try:
            message = await asyncio.to_thread(
                wait_state, api, chat_id, message_id, {"complete", "failed", "aborted_by_worker"}, 60
            )
            assert message["state"] == "complete" and message["attempts"] == 2, message
            # What readers had is kept, and continued: the budget of 4 less its one token.
            assert message["content"] == " partial w1 w2 w3"
            events = await asyncio.to_thread(api.events, chat_id, message_id)
            kinds = [e.data["event_type"] for e in events]
            continued = [e.data for e in events if e.data["event_type"] == "continuation"]
            assert "retry" not in kinds and len(continued) == 1, kinds
            assert "lease expired" in continued[0]["reason"], continued
        finally:
            rescuer.stop()

    try:
        asyncio.run(scenario())
    finally:
        server_a.stop()
        server_b.stop()


def _stack(url: str, server: ManagedProcess, log_dir: Path, backend: FakeBackend) -> Stack:
    return Stack(
        url=url,
        model_name="",
        server=server,
        workers=[],
        log_dir=log_dir,
        server_env={},
        backend_url=backend.url,
    )


async def _open_reader(client, url: str, headers: dict[str, str], opened: list) -> int:
    """Open one event stream; keep it open (in ``opened``) if the server lets it through."""
    request = client.build_request("GET", url, headers=headers)
    response = await client.send(request, stream=True)
    if response.status_code == 200:
        opened.append(response)
    else:
        body = json.loads(await response.aread())
        assert body["code"] == "too_many_readers", body
        await response.aclose()
    return response.status_code


@pytest.fixture
def flood_stack(cpu_backend, redis_prefix: str, tmp_path: Path) -> Iterator[Stack]:
    """Postgres and Redis with the default ping timeout: a thousand connections at once on a busy
    machine may hold a pong up longer than the fault stacks' two seconds."""
    with fresh_database("oasst_flood") as database_url:
        stack = start_stack(
            tmp_path,
            cpu_backend.url,
            database_url,
            REDIS_URL,
            workers=0,
            OASST_SERVER_REDIS_KEY_PREFIX=f"{redis_prefix}flood:{uuid.uuid4().hex[:6]}:",
        )
        try:
            yield stack
        finally:
            stack.stop()


def test_a_thousand_readers_of_one_answer_get_429_past_the_cap_and_nobody_else_notices(
    flood_stack, fake_backend
):
    """One user opens 1,000 event streams on one answer at once: the first ``max_sse_readers_per_message``
    stream, the rest get 429 at once; the answer completes; another user's answer on the same model,
    read meanwhile, is untouched."""

    model = fake_model()
    worker = start_fake_worker(flood_stack, fake_backend, model, OASST_WORKER_MAX_PARALLEL_REQUESTS="2")
    flooder, bystander = new_api(flood_stack), new_api(flood_stack)
    # 30 s of answer (one token every 50 ms): it streams for the whole flood.
    chat_id, message_id = queue(flooder, model.name, "[[slow]] a long answer", max_new_tokens=600)
    url = f"{flood_stack.url}/chats/{chat_id}/messages/{message_id}/events"
    headers = {"Authorization": f"Bearer {flooder.token}", "Accept": "text/event-stream"}

    async def flood() -> tuple[list[int], list]:
        opened: list = []
        limits = httpx.Limits(max_connections=1100, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            statuses = await asyncio.gather(
                *(_open_reader(client, url, headers, opened) for _ in range(1000))
            )
            # Meanwhile another user asks and reads on the same model: every token, no retry.
            other = await asyncio.to_thread(queue, bystander, model.name, "and mine", max_new_tokens=5)
            events = await asyncio.to_thread(bystander.events, *other)
            # Every open reader gets the whole answer.
            finals = []
            for response in opened:
                async for line in response.aiter_lines():
                    if line.startswith("data:") and '"event_type":"message"' in line:
                        finals.append(json.loads(line[5:])["message"]["content"])
                        break
                await response.aclose()
        return statuses, [events, finals]

    statuses, (events, finals) = asyncio.run(flood())
    cap = 8  # max_sse_readers_per_message, the default
    assert statuses.count(200) == cap, sorted(set(statuses))
    assert statuses.count(429) == 1000 - cap
    assert len(finals) == cap and set(finals) == {"".join(f" w{i}" for i in range(1, 601))}
    assert "retry" not in event_types(events)
    other = final_of(events)
    assert other["event_type"] == "message" and other["message"]["content"] == " w1 w2 w3 w4 w5"
    # The slots are given back: the same user reads the finished answer again.
    assert final_of(flooder.events(chat_id, message_id))["event_type"] == "message"
    worker.stop()
