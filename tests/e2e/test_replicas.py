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
from tests.support.processes import ManagedProcess, free_port, start_process, wait_for_model, wait_http_ok
from tests.support.services import REDIS_URL, fresh_database, fresh_redis_prefix
from tests.support.stacks import MODEL_NAME, BackendProcess, server_env

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
    processes: list[ManagedProcess] = []
    urls = []
    try:
        for index in range(2):
            port = free_port()
            env = server_env(
                port,
                shared_database,
                REDIS_URL,
                OASST_SERVER_REDIS_KEY_PREFIX=shared_prefix,
                OASST_SERVER_ADMIN_ROOT_TOKEN=ADMIN_TOKEN,
                OASST_SERVER_API_ROOT=f"http://127.0.0.1:{port}",
            )
            processes.append(start_process(f"replica{index}", "oasst_inference_server", env, tmp_path))
            urls.append(f"http://127.0.0.1:{port}")
        for url, process in zip(urls, processes, strict=True):
            wait_http_ok(f"{url}/health", process, timeout=90)
        yield urls
    finally:
        for process in processes:
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
