"""A Responses stream cut mid-answer (a proxy drops the connection) resumes with ``starting_after`` on
another replica after the replica that served it is killed: the stream lives in Redis, not in the
replica. Two replicas share Postgres and Redis; the worker is connected to the one that survives.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.support.processes import ManagedProcess, start_process, wait_for_model
from tests.support.services import fresh_database, fresh_redis_prefix
from tests.support.stacks import MODEL_NAME, BackendProcess, start_replicas
from tests.support.tcp_cutting_proxy import CuttingProxy

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

ADMIN_TOKEN = "responses-replica-admin-token-0123456789ab"


@pytest.fixture
def replicas(tmp_path) -> Iterator[list[tuple[str, ManagedProcess]]]:
    with (
        fresh_database("oasst_resp_replicas") as database,
        fresh_redis_prefix("test:resp-replicas") as prefix,
    ):
        started = start_replicas(
            tmp_path, database, prefix, ("replica0", "replica1"), OASST_SERVER_ADMIN_ROOT_TOKEN=ADMIN_TOKEN
        )
        try:
            yield started
        finally:
            for _, process in started:
                process.stop()


def _deltas(events: list[Any]) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


def test_a_cut_responses_stream_resumes_on_another_replica_after_its_replica_is_killed(
    replicas: list[tuple[str, ManagedProcess]], cpu_backend: BackendProcess, tmp_path
) -> None:
    (survivor, _), (doomed, doomed_process) = replicas
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    created = httpx.post(f"{survivor}/admin/workers", json={"name": "resp-replica-worker"}, headers=admin)
    assert created.status_code == 201, created.text
    worker = start_process(
        "worker",
        "oasst_worker",
        {
            "OASST_WORKER_SERVER_URL": survivor.replace("http://", "ws://", 1),
            "OASST_WORKER_API_KEY": created.json()["api_key"],
            "OASST_WORKER_BACKEND_URL": cpu_backend.url,
        },
        tmp_path,
    )
    try:
        wait_for_model(doomed, MODEL_NAME, timeout=90)
        login = httpx.get(f"{doomed}/auth/callback/debug", params={"code": f"resp-{uuid.uuid4().hex[:8]}"})
        token = login.json()["access_token"]["access_token"]
        with CuttingProxy(doomed, b"event: response.output_text.delta", count=4) as proxy:
            client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=token, max_retries=0, timeout=120)
            stream = client.responses.create(
                model=MODEL_NAME, input="Describe a long walk by the sea.", background=True, stream=True,
                max_output_tokens=80, temperature=0,
            )  # fmt: skip
            first: list[Any] = []
            with pytest.raises((httpx.HTTPError, openai.APIError)):
                for event in stream:
                    first.append(event)
            assert proxy.cut.is_set()
        doomed_process.kill()
        assert first and first[-1].type == "response.output_text.delta"
        response_id = first[0].response.id

        other = openai.OpenAI(base_url=f"{survivor}/v1", api_key=token, max_retries=0, timeout=120)
        rest = list(
            other.responses.retrieve(response_id, stream=True, starting_after=first[-1].sequence_number)
        )
        events = first + rest
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert events[-1].type in ("response.completed", "response.incomplete")
        final = other.responses.retrieve(response_id)
        assert _deltas(events) == events[-1].response.output_text == final.output_text != ""
    finally:
        worker.stop()
