"""Usage limits of API keys across two server replicas sharing one Postgres and one Redis, with a real
worker and the bundled CPU backend: a burst split between the replicas cannot pass a key's requests per
minute, and a token budget stops the key at the right count, charged from the workers' usage reports
(whichever replica holds the worker's socket), on either replica."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from oasst_inference_server.admin_cli import main as admin_cli
from oasst_inference_server.settings import Settings
from tests.support.processes import start_process, wait_for_model
from tests.support.services import fresh_database, fresh_redis_prefix
from tests.support.stacks import MODEL_NAME, BackendProcess, start_replicas

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

ADMIN_TOKEN = "limits-replica-admin-token-0123456789abcdef"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture(scope="module")
def shared_database() -> Iterator[str]:
    with fresh_database("oasst_limit_replicas") as url:
        yield url


@pytest.fixture(scope="module")
def replicas(shared_database, tmp_path_factory, cpu_backend: BackendProcess) -> Iterator[list[str]]:
    log_dir = tmp_path_factory.mktemp("limit-replicas")
    with fresh_redis_prefix("test:limit-replicas") as prefix:
        started = start_replicas(
            log_dir,
            shared_database,
            prefix,
            ("limits0", "limits1"),
            OASST_SERVER_ADMIN_ROOT_TOKEN=ADMIN_TOKEN,
            OASST_SERVER_RATE_LIMIT_PER_MINUTE="0",
            OASST_SERVER_MAX_CONCURRENT_GENERATIONS_PER_USER="0",
        )
        urls = [url for url, _ in started]
        created = httpx.post(f"{urls[1]}/admin/workers", json={"name": "limits-worker"}, headers=ADMIN)
        assert created.status_code == 201, created.text
        worker = start_process(
            "worker",
            "oasst_worker",
            {
                "OASST_WORKER_SERVER_URL": urls[0].replace("http://", "ws://", 1),
                "OASST_WORKER_API_KEY": created.json()["api_key"],
                "OASST_WORKER_BACKEND_URL": cpu_backend.url,
            },
            log_dir,
        )
        try:
            for url in urls:
                wait_for_model(url, MODEL_NAME, timeout=90)
            yield urls
        finally:
            worker.stop()
            for _, process in started:
                process.stop()


def new_key(shared_database: str, capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """A new user's API key, made by the admin CLI on the shared database: (key id, key)."""
    settings = Settings(_env_file=None, database_url=shared_database)  # type: ignore[call-arg]
    name = f"limits-{uuid.uuid4().hex[:8]}"
    capsys.readouterr()
    assert admin_cli(["create-api-key", "--user", name], settings=settings) == 0
    key = capsys.readouterr().out.strip()
    return _key_id(key, settings, capsys), key


def _key_id(key: str, settings: Settings, capsys: pytest.CaptureFixture[str]) -> str:
    assert admin_cli(["keys"], settings=settings) == 0
    listed = json.loads(capsys.readouterr().out)
    return next(k["id"] for k in listed if key.startswith(k["prefix"]))


def ask(url: str, key: str, max_tokens: int = 4) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        json={
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": "Count to ten."}],
            "max_tokens": max_tokens,
            "temperature": 0,
        },
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )


def test_a_burst_split_between_replicas_cannot_pass_a_key_s_requests_per_minute(
    replicas, shared_database, capsys
) -> None:
    key_id, key = new_key(shared_database, capsys)
    put = httpx.put(
        f"{replicas[1]}/admin/keys/{key_id}/limits", json={"requests_per_minute": 3}, headers=ADMIN
    )
    assert put.status_code == 200, put.text
    with ThreadPoolExecutor(max_workers=10) as pool:
        responses = list(pool.map(lambda i: ask(replicas[i % 2], key, 2), range(10)))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] * 3 + [429] * 7, [r.text for r in responses]
    for refused in (r for r in responses if r.status_code == 429):
        assert refused.json()["error"]["code"] == "key_requests_per_minute"
        assert 1 <= int(refused.headers["Retry-After"]) <= 60


def test_a_token_budget_stops_the_key_at_the_right_count_on_both_replicas(
    replicas, shared_database, capsys
) -> None:
    key_id, key = new_key(shared_database, capsys)
    budget = 150
    put = httpx.put(
        f"{replicas[0]}/admin/keys/{key_id}/limits",
        json={"budget_tokens": budget, "budget_period": "day"},
        headers=ADMIN,
    )
    assert put.status_code == 200, put.text
    used, answered = 0, 0
    for i in range(40):
        response = ask(replicas[i % 2], key, 8)
        if response.status_code == 429:
            error = response.json()["error"]
            assert error["code"] == "key_budget_exceeded"
            assert f"{used} of its {budget} tokens" in error["message"]
            break
        assert response.status_code == 200, response.text
        assert used < budget, f"admitted with {used} of {budget} tokens used"
        used += response.json()["usage"]["total_tokens"]
        answered += 1
    else:
        pytest.fail("the budget never stopped the key")
    assert used >= budget and answered >= 2
    # Refused on the other replica too, and the admin views agree with the usage reports.
    refused = ask(replicas[(i + 1) % 2], key)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "key_budget_exceeded"
    keys = httpx.get(f"{replicas[1]}/admin/keys", headers=ADMIN).json()
    usage = next(k for k in keys if k["id"] == key_id)["usage"]
    assert usage["tokens_today"] == used and usage["requests_today"] == answered
    rows = httpx.get(f"{replicas[0]}/admin/usage", params={"key_id": key_id}, headers=ADMIN).json()
    assert sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows) == used
