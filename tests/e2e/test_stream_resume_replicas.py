"""A ``/v1`` stream resumes on another replica, also after the replica that served it was killed: the
answer's events live in Redis. A stream nobody resumes is cancelled once its grace has passed.

Two replicas share one Postgres and one Redis; the worker (the real CPU backend with SmolLM2) is
connected to the second, the client streams from the first through a proxy that drops the connection.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.openai_api.conftest import ApiUser
from tests.support.processes import ManagedProcess, start_process, wait_for_model
from tests.support.resumable_streams import (
    cut_chat_stream,
    cutting_proxy,
    read_events,
    resume,
    text_of,
)
from tests.support.services import fresh_database, fresh_redis_prefix
from tests.support.stacks import MODEL_NAME, WORKER_API_KEY, BackendProcess, start_replicas

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

GRACE = 3.0
QUESTION = [{"role": "user", "content": "Explain in a few sentences why the sky is blue."}]
GREEDY = {"model": MODEL_NAME, "messages": QUESTION, "temperature": 0, "max_tokens": 48}


@pytest.fixture
def replicas(cpu_backend: BackendProcess, tmp_path) -> Iterator[list[tuple[str, ManagedProcess]]]:
    with fresh_database("oasst_resume") as database, fresh_redis_prefix("test:resume") as prefix:
        started = start_replicas(
            tmp_path,
            database,
            prefix,
            ("replica0", "replica1"),
            OASST_SERVER_OPENAI_STREAM_RESUME_GRACE_SECONDS=str(GRACE),
        )
        worker = start_process(
            "worker",
            "oasst_worker",
            {
                "OASST_WORKER_SERVER_URL": started[1][0].replace("http://", "ws://", 1),
                "OASST_WORKER_API_KEY": WORKER_API_KEY,
                "OASST_WORKER_BACKEND_URL": cpu_backend.url,
            },
            tmp_path,
        )
        try:
            wait_for_model(started[0][0], MODEL_NAME, timeout=90)
            yield started
        finally:
            worker.stop()
            for _, process in started:
                process.stop()


def test_a_stream_cut_on_one_replica_resumes_on_the_other_after_it_is_killed(replicas) -> None:
    (first, first_process), (second, _) = replicas
    user = ApiUser(first, "resume-replicas")
    key = str(user.create_key()["key"])
    whole = user.client(key).chat.completions.create(**GREEDY).choices[0].message.content or ""
    assert whole

    with cutting_proxy(first, events=4) as (proxy, proxy_url):
        client = user.client(key)
        client.base_url = f"{proxy_url}/v1"
        cut = cut_chat_stream(proxy, client, **GREEDY)
    assert whole.startswith(cut.text) and cut.text != whole
    first_process.kill()  # the replica that served the stream, and its grace timer, are gone

    response = resume(second, key, "chat/completions", cut.completion_id, cut.last_event_id)
    assert response.status_code == 200, response.text
    events = read_events(response)
    assert events[-1].data == "[DONE]"
    assert cut.text + text_of(events) == whole
    ids = [e.id for e in events]
    assert len(set(ids)) == len(ids) and not set(ids) & set(proxy.relayed_ids)


def test_a_stream_nobody_resumes_is_cancelled_after_its_grace(replicas) -> None:
    (first, _), (second, _) = replicas
    user = ApiUser(first, "resume-grace")
    key = str(user.create_key()["key"])
    long_request = {**GREEDY, "max_tokens": 1500}
    long_request["messages"] = [{"role": "user", "content": "Count from 1 to 2000, one number per line."}]
    # At least 300 numbers, so the answer outlasts the grace (the model alone stops counting at 20).
    long_request["response_format"] = {
        "type": "json_schema",
        "json_schema": {
            "name": "numbers",
            "schema": {
                "type": "object",
                "properties": {"numbers": {"type": "array", "items": {"type": "integer"}, "minItems": 300}},
                "required": ["numbers"],
                "additionalProperties": False,
            },
        },
    }

    with cutting_proxy(first, events=3) as (proxy, proxy_url):
        client = user.client(key)
        client.base_url = f"{proxy_url}/v1"
        cut_at = time.monotonic()
        cut = cut_chat_stream(proxy, client, **long_request)
    request_id = cut.completion_id.removeprefix("chatcmpl-")

    # Within the grace, the message is still being generated ...
    record = user.request_record(request_id)
    if time.monotonic() - cut_at < GRACE - 1:
        assert record["state"] in ("pending", "in_progress"), record
    # ... after it, it is cancelled (seen from the other replica).
    other = ApiUser(second, "resume-grace")
    finished = other.wait_finished(request_id, timeout=60)
    assert finished["state"] == "cancelled", finished
    assert (finished["completion_tokens"] or 0) < 1500
