"""A message that kills its backend, and work a worker cannot read, fail alone: real server (Postgres +
Redis), real workers, scripted backends (``[[die]]`` makes one exit mid-answer).

* The worker tells a backend that died mid-request from one that only cut a stream and reports it; the
  server counts the deaths per message and, at ``max_backend_deaths`` (1 here), fails the message
  instead of sending it to the next backend. The other answers complete; the healthy worker never
  receives the poison.
* A work frame the worker cannot parse is answered with an error for its message, which fails at once
  (it used to be dropped silently, and the message hung until its in-progress bound).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from tests.support.fake_workers import (
    FAST_TIMINGS,
    FakeBackend,
    fake_model,
    start_fake_backend,
    start_fake_worker,
)
from tests.support.fault_flows import final_of, new_api, queue, wait_state
from tests.support.processes import ManagedProcess
from tests.support.services import REDIS_URL, fresh_database
from tests.support.stacks import Stack, start_stack

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def poison_database() -> Iterator[str]:
    with fresh_database("oasst_poison") as url:
        yield url


@pytest.fixture(scope="module")
def poison_stack(
    poison_database: str, redis_prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    stack = start_stack(
        tmp_path_factory.mktemp("poison-stack"),
        "http://127.0.0.1:9",  # every worker here brings its own backend
        poison_database,
        REDIS_URL,
        workers=0,
        OASST_SERVER_REDIS_KEY_PREFIX=f"{redis_prefix}poison:{uuid.uuid4().hex[:6]}:",
        OASST_SERVER_MAX_BACKEND_DEATHS="1",
        **FAST_TIMINGS,
    )
    yield stack
    stack.stop()


@pytest.fixture
def backends(tmp_path: Path) -> Iterator[tuple[FakeBackend, FakeBackend]]:
    fault, healthy = start_fake_backend(tmp_path), start_fake_backend(tmp_path)
    yield fault, healthy
    fault.process.stop()
    healthy.process.stop()


def busy_worker(stack: Stack, backend: FakeBackend, model, api) -> tuple[ManagedProcess, tuple[str, str]]:
    """A worker of one slot, and the slow answer that holds it (so other work waits or goes elsewhere)."""
    worker = start_fake_worker(stack, backend, model, OASST_WORKER_MAX_PARALLEL_REQUESTS="1")
    busy = queue(api, model.name, "[[slow]] hold the only slot", max_new_tokens=80)
    wait_state(api, *busy, {"in_progress"}, 30)
    return worker, busy


def test_a_message_that_kills_its_backend_fails_and_never_reaches_the_healthy_worker(
    poison_stack: Stack, backends: tuple[FakeBackend, FakeBackend]
):
    fault, healthy = backends
    model = fake_model()
    api = new_api(poison_stack)
    # The healthy worker first, busy with a slow answer, so that the poison goes to the other one.
    healthy_worker, bystander = busy_worker(poison_stack, healthy, model, api)
    fault_worker = start_fake_worker(poison_stack, fault, model, OASST_WORKER_MAX_PARALLEL_REQUESTS="2")
    poison = queue(api, model.name, "[[die]] the request that crashes backends", max_new_tokens=20)

    final = final_of(api.events(*poison))
    assert final["event_type"] == "error", final
    assert final["message"]["state"] == "aborted_by_worker" and final["message"]["attempts"] == 1
    assert "the backend died once" in final["error"], final["error"]
    assert fault.process.proc.wait(timeout=10) == 3  # it did die of it

    # The other answers complete, on the healthy worker, with no retry.
    events = api.events(*bystander)
    assert "retry" not in [e.data["event_type"] for e in events]
    assert final_of(events)["message"]["content"] == "".join(f" w{i}" for i in range(1, 81))
    after = queue(api, model.name, "and another question", max_new_tokens=3)
    assert final_of(api.events(*after))["message"]["content"] == " w1 w2 w3"
    # The poison never reached the healthy worker or its backend, though it was there all along.
    assert not [p for p in healthy.prompts() if "[[die]]" in p]
    assert poison[1] not in healthy_worker.log_path.read_text()
    assert poison[1] in fault_worker.log_path.read_text()
    assert fault_worker.alive() and healthy_worker.alive()  # a dead backend ends no worker
    healthy_worker.stop()
    fault_worker.stop()


def deep_schema(depth: int) -> dict:
    schema: dict = {}
    for _ in range(depth):
        schema = {"a": schema}
    return schema


async def set_sampling(database_url: str, message_id: str, sampling: dict) -> None:
    connection = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://", 1))
    try:
        await connection.execute(
            "UPDATE message SET sampling_parameters = $1::json WHERE id = $2 AND state = 'pending'",
            json.dumps(sampling),
            message_id,
        )
    finally:
        await connection.close()


def test_a_stored_message_whose_work_the_worker_cannot_read_fails_at_once(
    poison_stack: Stack, poison_database: str, backends: tuple[FakeBackend, FakeBackend]
):
    _, backend = backends
    model = fake_model()
    api = new_api(poison_stack)
    worker, busy = busy_worker(poison_stack, backend, model, api)
    # A message stored meanwhile (as one from before the bounds on schemas): its response_format is
    # nested deeper than the worker's JSON parser goes, though the server writes it without trouble.
    stored = queue(api, model.name, "an ordinary question", max_new_tokens=5)
    sampling = api.client.get(f"/chats/{stored[0]}/messages/{stored[1]}").json()["sampling_parameters"]
    sampling["response_format"] = {
        "type": "json_schema",
        "json_schema": {"name": "deep", "schema": deep_schema(200)},
    }
    asyncio.run(set_sampling(poison_database, stored[1], sampling))
    final = final_of(api.events(*stored))
    assert final["event_type"] == "error", final
    assert "cannot read the work frame" in final["error"] and "recursion" in final["error"], final["error"]
    assert final["message"]["state"] == "aborted_by_worker" and final["message"]["attempts"] == 1
    # Failed on its first attempt: not retried after the in-progress bound (minutes), as a dropped
    # frame was.
    assert final_of(api.events(*busy))["message"]["state"] == "complete"
    # Only that message: the worker's next answer is as usual.
    after = queue(api, model.name, "and another question", max_new_tokens=3)
    assert final_of(api.events(*after))["message"]["content"] == " w1 w2 w3"
    worker.stop()
