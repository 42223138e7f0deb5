"""Model aliases and fallbacks with two server replicas (processes) on one Postgres and one Redis, and a real
worker with the bundled CPU backend (SmolLM2) connected to the first: an alias switched through one
replica acts on the other at once, on every API that takes a model name; a model with no worker is served
by its fallback, and the response's ``model`` and the usage record name the model that served.

The model-config folder both replicas read holds a config no worker serves or can load, with a fallback to
SmolLM2 and a stable alias. (The Q8_0 built-in would not do: the CPU backend's worker can load it, and a
request for it waits for the load.)"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.processes import start_process, wait_for_model
from tests.support.services import fresh_database, fresh_redis_prefix
from tests.support.stacks import MODEL_NAME, BackendProcess, start_replicas

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

ADMIN_TOKEN = "aliases-test-admin-token-0123456789abcdef"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
NO_WORKER = "e2e-unserved"  # a config of the folder: no worker serves it or can load it
FILE_ALIAS = "smollm-stable"
EMBEDDING = "all-MiniLM-L6-v2"  # a known config of another kind, with no worker here
SHORT = {"max_tokens": 4, "temperature": 0}


@pytest.fixture
def replicas(tmp_path: Path, cpu_backend: BackendProcess) -> Iterator[list[str]]:
    configs = tmp_path / "models"
    configs.mkdir()
    unserved = {"name": NO_WORKER, "model_id": "nowhere/unserved", "backend": "openai"}
    (configs / "unserved.yaml").write_text(
        yaml.safe_dump({**unserved, "aliases": [FILE_ALIAS], "fallbacks": [MODEL_NAME]}), encoding="utf-8"
    )
    with fresh_database("oasst_aliases") as url, fresh_redis_prefix("test:aliases") as prefix:
        started = start_replicas(
            tmp_path,
            url,
            prefix,
            OASST_SERVER_ADMIN_ROOT_TOKEN=ADMIN_TOKEN,
            OASST_SERVER_MODEL_CONFIGS_DIR=str(configs),
        )
        first = started[0][0]
        worker = start_process(
            "worker",
            "oasst_worker",
            {
                "OASST_WORKER_SERVER_URL": first.replace("http://", "ws://", 1),
                "OASST_WORKER_API_KEY": "test-worker-key",
                "OASST_WORKER_BACKEND_URL": cpu_backend.url,
            },
            tmp_path,
        )
        try:
            for replica, _ in started:
                wait_for_model(replica, MODEL_NAME, timeout=90)
            yield [replica for replica, _ in started]
        finally:
            worker.stop()
            for _, process in started:
                process.stop()


def signed_in(base_url: str, token: str | None = None) -> httpx.Client:
    client = httpx.Client(base_url=base_url, timeout=60)
    if token is None:
        login = client.get("/auth/callback/debug", params={"code": f"alias-user-{uuid.uuid4().hex[:6]}"})
        login.raise_for_status()
        token = login.json()["access_token"]["access_token"]
    client.headers["Authorization"] = f"Bearer {token}"
    return client


def chat(client: httpx.Client, model: str) -> httpx.Response:
    return client.post(
        "/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "Hi"}], **SHORT},
    )


def served(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return str(response.json()["model"])


def put_alias(base_url: str, alias: str, model: str, fallbacks: list[str] | None = None) -> dict[str, Any]:
    response = httpx.put(
        f"{base_url}/admin/aliases/{alias}",
        json={"model": model, "fallbacks": fallbacks or []},
        headers=ADMIN,
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_an_alias_switch_acts_on_both_replicas_and_a_fallback_serves(replicas):
    a_url, b_url = replicas
    a = signed_in(a_url)
    b = signed_in(b_url, a.headers["Authorization"].removeprefix("Bearer "))  # the same user on B
    try:
        # A model no worker serves falls back (the files' fallback); the response and the usage record
        # name the model that served.
        fell_back = chat(b, NO_WORKER)
        assert served(fell_back) == MODEL_NAME
        record = a.get(f"/usage/requests/{fell_back.json()['id']}")
        assert record.status_code == 200, record.text
        assert record.json()["model_config_name"] == MODEL_NAME
        # A file's alias, listed on both replicas with the config it stands for.
        assert served(chat(a, FILE_ALIAS)) == MODEL_NAME
        for client in (a, b):
            cards = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
            assert cards[FILE_ALIAS]["alias_of"] == NO_WORKER

        # An alias set through A acts on B at once, on each API that takes a model name.
        alias = f"e2e-{uuid.uuid4().hex[:6]}"
        put_alias(a_url, alias, MODEL_NAME)
        assert served(chat(b, alias)) == MODEL_NAME
        completion = b.post("/v1/completions", json={"model": alias, "prompt": "Hello", **SHORT})
        assert served(completion) == MODEL_NAME
        messages = b.post(
            "/v1/messages",
            json={"model": alias, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]},
        )
        assert served(messages) == MODEL_NAME
        response = b.post("/v1/responses", json={"model": alias, "input": "Hi", "max_output_tokens": 16})
        assert served(response) == MODEL_NAME
        chat_id = b.post("/chats", json={}).json()["id"]
        prompt = b.post(f"/chats/{chat_id}/prompter_message", json={"content": "Hi"}).json()
        answer = b.post(
            f"/chats/{chat_id}/assistant_message",
            json={
                "parent_id": prompt["id"],
                "model_config_name": alias,
                "sampling_parameters": {"max_new_tokens": 4},
            },
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["model_config_name"] == MODEL_NAME

        # Switched through B to the embedding model (no worker here): A answers for it at once, and does
        # not fall back (an alias set without fallbacks takes its config's, and it has none).
        put_alias(b_url, alias, EMBEDDING)
        refused = chat(a, alias)
        assert refused.status_code == 503, refused.text
        assert f"{EMBEDDING!r} (alias {alias!r})" in refused.json()["error"]["message"]

        # Switched through B to the model with no worker and an explicit fallback: A serves by it.
        put_alias(b_url, alias, NO_WORKER, [MODEL_NAME])
        assert served(chat(a, alias)) == MODEL_NAME
        listed = httpx.get(f"{a_url}/admin/aliases", headers=ADMIN).json()
        entry = next(x for x in listed["aliases"] if x["alias"] == alias)
        assert (entry["model"], entry["fallbacks"], entry["source"]) == (NO_WORKER, [MODEL_NAME], "api")
        assert listed["fallbacks"] == {NO_WORKER: [MODEL_NAME]}
    finally:
        a.close()
        b.close()
