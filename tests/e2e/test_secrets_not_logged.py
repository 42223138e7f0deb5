"""Nothing secret is logged: a full run at DEBUG level, then every log is searched for
every token and key the run created or configured."""

from __future__ import annotations

import base64
import json
import secrets
import uuid

import httpx
import pytest

from oasst_inference_server.auth.trusted_client import TrustedClient, encode_trusted_client
from tests.e2e.chat_api import ChatApi
from tests.support.clients import closing
from tests.support.processes import wait_for_model
from tests.support.stacks import start_stack

pytestmark = pytest.mark.slow


def test_a_full_run_logs_no_token_or_key(cpu_backend, tmp_path):
    admin_token = secrets.token_hex(32)
    auth_secret = secrets.token_hex(32)
    trusted_key = secrets.token_hex(20)
    stack = start_stack(
        tmp_path,
        cpu_backend.url,
        f"sqlite+aiosqlite:///{tmp_path}/s.db",
        None,
        workers=0,
        OASST_SERVER_LOG_LEVEL="DEBUG",
        OASST_SERVER_ADMIN_ROOT_TOKEN=admin_token,
        OASST_SERVER_AUTH_SECRET=auth_secret,
        OASST_SERVER_TRUSTED_CLIENT_API_KEYS=json.dumps([f"website:{trusted_key}"]),
    )
    found: list[str] = []
    try:
        http = closing(httpx.Client(base_url=stack.url, timeout=120))
        admin = {"Authorization": f"Bearer {admin_token}"}
        worker = http.post("/admin/workers", json={"name": "logged"}, headers=admin).json()
        stack.start_worker(OASST_WORKER_API_KEY=worker["api_key"], OASST_WORKER_LOG_LEVEL="DEBUG")
        wait_for_model(stack.url, stack.model_name)

        user = ChatApi(stack.url, f"secret-{uuid.uuid4().hex[:6]}")
        login = http.get("/auth/callback/debug", params={"code": user.username}).json()
        refreshed = http.post("/auth/refresh", json={"refresh_token": login["refresh_token"]["access_token"]})
        assert refreshed.status_code == 200, refreshed.text
        tokens = [
            user.token,
            login["access_token"]["access_token"],
            login["refresh_token"]["access_token"],
            refreshed.json()["access_token"]["access_token"],
            refreshed.json()["refresh_token"]["access_token"],
        ]
        key = http.post(
            "/api_keys", json={"name": "k"}, headers={"Authorization": f"Bearer {user.token}"}
        ).json()
        # A chat answer streamed by the worker, and an OpenAI-style completion with the API key.
        chat_id = user.create_chat()
        _, events = user.ask(chat_id, "Say hi.", stack.model_name, max_new_tokens=8)
        assert events[-1].data["event_type"] == "message", events[-1].data
        completion = http.post(
            "/v1/chat/completions",
            json={
                "model": stack.model_name,
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 8,
            },
            headers={"Authorization": f"Bearer {key['key']}"},
        )
        assert completion.status_code == 200, completion.text
        # A trusted frontend's request; failed sign-ins with secrets in them are logged too.
        header = encode_trusted_client(
            TrustedClient(
                api_key=trusted_key,
                client="website",
                user_id=str(uuid.uuid4()),
                provider_account_id="a",
                username="w",
            )
        )
        assert http.get("/chats", headers={"TrustedClient": header}).status_code == 200
        wrong_key = "oak-" + secrets.token_urlsafe(24)
        assert http.get("/v1/models", headers={"Authorization": f"Bearer {wrong_key}"}).status_code == 401
        assert http.post(f"/admin/users/{key['id']}/revoke_tokens", headers=admin).status_code in (200, 404)
        replaced = http.post(f"/admin/workers/{worker['id']}/api_key", headers=admin).json()
        wrong_worker_key = secrets.token_hex(16)
        with httpx.Client(base_url=stack.url) as probe:
            probe.get("/workers/work", headers={"X-API-Key": wrong_worker_key})
    finally:
        stack.stop()
    logs = {p.name: p.read_text(errors="replace") for p in tmp_path.glob("*.log")}
    assert any("DEBUG" in text for text in logs.values()), list(logs)
    secret_values = {
        "admin root token": admin_token,
        "auth secret": auth_secret,
        "trusted-client key": trusted_key,
        "trusted-client header": header,
        "worker key": worker["api_key"],
        "replaced worker key": replaced["api_key"],
        "API key": key["key"],
        "wrong API key": wrong_key,
        "wrong worker key": wrong_worker_key,
        **{f"token {i}": token for i, token in enumerate(tokens)},
    }
    for name, value in secret_values.items():
        variants = {value, base64.b64encode(value.encode()).decode()}
        for log_name, text in logs.items():
            if any(v in text for v in variants):
                found.append(f"{name} in {log_name}")
    assert not found, found
