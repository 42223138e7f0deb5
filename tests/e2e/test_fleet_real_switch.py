"""Models on demand with every part real: the server, a worker and the bundled CPU backend serving
SmolLM2 as shipped. ``/v1/models`` lists the Q8_0 config the worker can switch to as not loaded; a
request for it is answered after the worker drained, had the backend quantize and load it and announced
it; a request for the first model then moves the worker back; an unknown model is a 404."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from oasst_shared.model_configs import SMOLLM2_135M, SMOLLM2_135M_Q8
from tests.support.stacks import Stack, start_cpu_backend, start_stack

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir: Path = tmp_path_factory.mktemp("fleet-real")
    backend = start_cpu_backend(log_dir)  # its own: this test switches the model it serves
    try:
        stack = start_stack(
            log_dir,
            backend.url,
            f"sqlite+aiosqlite:///{log_dir}/oasst.db",
            None,
            OASST_SERVER_FLEET_INTERVAL="0.5",
        )
        try:
            yield stack
        finally:
            stack.stop()
    finally:
        backend.process.stop()


def signed_in(http: httpx.Client) -> None:
    login = http.get("/auth/callback/debug", params={"code": f"switch-{uuid.uuid4().hex[:8]}"})
    login.raise_for_status()
    http.headers["Authorization"] = f"Bearer {login.json()['access_token']['access_token']}"


def cards(http: httpx.Client) -> dict[str, dict]:
    response = http.get("/v1/models")
    response.raise_for_status()
    return {card["id"]: card for card in response.json()["data"]}


def ask(http: httpx.Client, model: str) -> httpx.Response:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
        "temperature": 0,
    }
    return http.post("/v1/chat/completions", json=body, timeout=180)


def test_a_model_nobody_has_loaded_is_answered_after_a_real_switch(stack: Stack) -> None:
    with httpx.Client(base_url=stack.url) as http:
        signed_in(http)
        listed = cards(http)
        assert listed[SMOLLM2_135M.name]["loaded"] is True
        assert listed[SMOLLM2_135M_Q8.name]["loaded"] is False
        assert listed[SMOLLM2_135M_Q8.name]["quantization"] == SMOLLM2_135M_Q8.quantization

        answer = ask(http, SMOLLM2_135M_Q8.name)
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == SMOLLM2_135M_Q8.name
        assert answer.json()["choices"][0]["message"]["content"]
        assert answer.json()["usage"]["completion_tokens"] > 0
        listed = cards(http)
        assert listed[SMOLLM2_135M_Q8.name]["loaded"] is True
        assert listed[SMOLLM2_135M.name]["loaded"] is False  # its one worker moved

        back = ask(http, SMOLLM2_135M.name)  # and back again, on demand
        assert back.status_code == 200, back.text
        assert back.json()["model"] == SMOLLM2_135M.name

        unknown = ask(http, "no-such-model")
        assert unknown.status_code == 404
        assert unknown.json()["error"]["code"] == "model_not_found"
