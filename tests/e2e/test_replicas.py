"""Several server replicas share one Postgres and one Redis: a worker connected to one replica serves
a client of another, with the real CPU backend.

Both replicas start at the same moment on an empty database, so this also checks that concurrent
start-up migrations take turns. The worker signs in with a key created through the admin API of the
other replica (a key from the database, not from settings).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.chat_api import ChatApi, tokens_text
from tests.support.clients import closing
from tests.support.processes import start_process, wait_for_model
from tests.support.services import fresh_database, fresh_redis_prefix
from tests.support.stacks import MODEL_NAME, BackendProcess, start_replicas

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

ADMIN_TOKEN = "replica-test-admin-token-0123456789abcdef"
GREEDY = {"do_sample": False, "max_new_tokens": 16}


@pytest.fixture
def shared_database() -> Iterator[str]:
    with fresh_database("oasst_replicas") as url:
        yield url


@pytest.fixture
def shared_prefix() -> Iterator[str]:
    with fresh_redis_prefix("test:replicas") as prefix:
        yield prefix


@pytest.fixture
def replicas(shared_database, shared_prefix, tmp_path) -> Iterator[list[str]]:
    started = start_replicas(
        tmp_path,
        shared_database,
        shared_prefix,
        ("replica0", "replica1"),
        OASST_SERVER_ADMIN_ROOT_TOKEN=ADMIN_TOKEN,
    )
    try:
        yield [url for url, _ in started]
    finally:
        for _, process in started:
            process.stop()


def test_a_worker_on_one_replica_serves_a_client_of_another(replicas, cpu_backend: BackendProcess, tmp_path):
    first, second = replicas
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    created = httpx.post(f"{second}/admin/workers", json={"name": "replica-test-worker"}, headers=admin)
    assert created.status_code == 201, created.text
    worker_key = created.json()["api_key"]

    worker = start_process(
        "worker",
        "oasst_worker",
        {
            "OASST_WORKER_SERVER_URL": first.replace("http://", "ws://", 1),
            "OASST_WORKER_API_KEY": worker_key,
            "OASST_WORKER_BACKEND_URL": cpu_backend.url,
        },
        tmp_path,
    )
    try:
        # The worker's session, published by the first replica, is visible to the second.
        wait_for_model(second, MODEL_NAME, timeout=90)
        sessions = httpx.get(f"{second}/admin/worker_sessions", headers=admin).json()
        assert [s["worker_name"] for s in sessions] == ["replica-test-worker"]
        assert sessions[0]["max_parallel_requests"] >= 1

        api = ChatApi(second, f"replica-user-{uuid.uuid4().hex[:6]}")
        chat_id = api.create_chat()
        message_id, events = api.ask(chat_id, "Say hello.", MODEL_NAME, **GREEDY)
        kinds = [e.data["event_type"] for e in events]
        assert kinds[-1] == "message" and "error" not in kinds and "token" in kinds
        final = events[-1].data["message"]
        assert final["state"] == "complete" and final["content"] == tokens_text(events) and final["content"]
        assert 1 <= final["generated_tokens"] <= GREEDY["max_new_tokens"]

        # The first replica serves the same chat and the finished message to the same user.
        other = closing(
            httpx.Client(base_url=first, headers={"Authorization": f"Bearer {api.token}"}, timeout=30)
        )
        assert other.get(f"/chats/{chat_id}/messages/{message_id}").json()["content"] == final["content"]
        assert [c["id"] for c in other.get("/chats").json()["chats"]] == [chat_id]

        # Deleting the worker on the second replica closes its socket on the first, and its key is
        # refused from then on: the worker exits with the "operator must act" code.
        deleted = httpx.delete(f"{second}/admin/workers/{created.json()['id']}", headers=admin)
        assert deleted.status_code == 204
        assert worker.proc.wait(timeout=60) == 2
        assert "refused the worker API key" in worker.log_tail()
    finally:
        worker.stop()
        if worker.alive():
            worker.kill()


def test_a_worker_key_bounds_models_slots_and_sockets_on_every_replica(
    replicas, cpu_backend: BackendProcess, tmp_path
):
    import asyncio
    import json

    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    from oasst_shared.model_configs import SMOLLM2_135M
    from oasst_shared.protocol import (
        CLOSE_KEY_FORBIDS,
        CLOSE_UNAUTHORIZED,
        PROTOCOL_VERSION,
        WorkerInfo,
        dump_frame,
    )

    first, second = replicas
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    allowed = f"fake-{uuid.uuid4().hex[:6]}"
    limits = {"allowed_models": [allowed], "max_slots": 2, "max_sockets": 1}
    created = httpx.post(f"{second}/admin/workers", json={"name": "bounded", **limits}, headers=admin)
    assert created.status_code == 201, created.text
    assert {k: created.json()[k] for k in limits} == limits
    worker_id, key = created.json()["id"], created.json()["api_key"]

    def info(name: str, slots: int) -> str:
        config = SMOLLM2_135M.model_copy(update={"name": name})
        return dump_frame(WorkerInfo(model_config=config, max_parallel_requests=slots, backend_kind="fake"))

    async def closed_with(url: str, hello: str) -> tuple[int | None, str]:
        headers = {"X-API-Key": key, "X-Protocol-Version": str(PROTOCOL_VERSION)}
        async with connect(url.replace("http", "ws") + "/workers/work", additional_headers=headers) as ws:
            await ws.send(hello)
            try:
                while True:
                    json.loads(await asyncio.wait_for(ws.recv(), 3))
            except (ConnectionClosed, asyncio.TimeoutError):
                pass
            return ws.close_code, ws.close_reason or ""

    async def scenario() -> None:
        code, reason = await closed_with(first, info("some-other-model", 1))
        assert code == CLOSE_KEY_FORBIDS and "model config" in reason
        code, reason = await closed_with(first, info(allowed, 3))
        assert code == CLOSE_KEY_FORBIDS and "at most 2" in reason
        headers = {"X-API-Key": key, "X-Protocol-Version": str(PROTOCOL_VERSION)}
        async with connect(first.replace("http", "ws") + "/workers/work", additional_headers=headers) as held:
            await held.send(info(allowed, 2))
            await asyncio.to_thread(wait_for_model, second, allowed)
            # The socket limit counts the sockets of every replica.
            code, reason = await closed_with(second, info(allowed, 1))
            assert code == CLOSE_KEY_FORBIDS and "sockets" in reason
            # A new key, issued on the other replica, closes the socket opened with the old one.
            rotated = httpx.post(f"{second}/admin/workers/{worker_id}/api_key", headers=admin)
            assert rotated.status_code == 200
            try:
                while True:
                    json.loads(await asyncio.wait_for(held.recv(), 10))
            except ConnectionClosed:
                pass
            assert held.close_code == CLOSE_UNAUTHORIZED

    asyncio.run(scenario())

    # A real worker whose key does not allow its model gives up with a clear message.
    narrow = httpx.post(
        f"{first}/admin/workers", json={"name": "narrow", "allowed_models": ["nope"]}, headers=admin
    ).json()
    worker = start_process(
        "narrow-worker",
        "oasst_worker",
        {
            "OASST_WORKER_SERVER_URL": first.replace("http://", "ws://", 1),
            "OASST_WORKER_API_KEY": narrow["api_key"],
            "OASST_WORKER_BACKEND_URL": cpu_backend.url,
        },
        tmp_path,
    )
    try:
        assert worker.proc.wait(timeout=90) == 2
        assert "API key does not allow it" in worker.log_tail() and "model config" in worker.log_tail()
    finally:
        if worker.alive():
            worker.kill()
