"""The rebalancer with every part real: a server, three workers each on a bundled CPU backend of its
own, two model configs (SmolLM2 as shipped, A; its Q8_0, B). All three start on A, whose minimum is one
worker. A burst on B while A is idle moves workers to B within the stated bound (one loaded on demand,
more by the rebalancer), A keeps its minimum throughout, every answer of the burst completes; a burst on
A afterwards moves workers back; the switches stay few (no flapping)."""

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

from oasst_shared.model_configs import SMOLLM2_135M, SMOLLM2_135M_Q8
from tests.support.processes import wait_for_model
from tests.support.stacks import BackendProcess, Stack, start_cpu_backend, start_stack

pytestmark = pytest.mark.slow

A, B = SMOLLM2_135M.name, SMOLLM2_135M_Q8.name
ADMIN = {"Authorization": "Bearer rebalancing-test-admin-token-0123456789"}
BOUND_SECONDS = 60  # the stated bound: B has two workers within this of its burst's start
BURST = 10


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir: Path = tmp_path_factory.mktemp("rebalancing-real")
    backends: list[BackendProcess] = []
    with contextlib.ExitStack() as cleanup:
        for _ in range(3):
            backend = start_cpu_backend(log_dir)
            cleanup.callback(backend.process.stop)
            backends.append(backend)
        stack = start_stack(
            log_dir,
            backends[0].url,
            f"sqlite+aiosqlite:///{log_dir}/oasst.db",
            None,
            OASST_SERVER_ADMIN_ROOT_TOKEN=ADMIN["Authorization"].split()[1],
            OASST_SERVER_FLEET_INTERVAL="0.5",
            OASST_SERVER_REBALANCE_INTERVAL="1",
            OASST_SERVER_REBALANCER_MIN_WORKERS=json.dumps({A: 1}),
            OASST_SERVER_REBALANCER_COOLDOWN="5",
            OASST_SERVER_REBALANCER_DEFAULT_LOAD_SECONDS="2",
            OASST_SERVER_PENDING_UPDATE_INTERVAL="0.5",
            OASST_SERVER_MAX_CONCURRENT_GENERATIONS_PER_USER="32",
            OASST_SERVER_RATE_LIMIT_PER_MINUTE="0",
        )
        cleanup.callback(stack.stop)
        for backend in backends[1:]:
            stack.start_worker(backend.url)
        wait_for_model(stack.url, A, workers=3)
        yield stack


def workers_per_model(http: httpx.Client) -> dict[str, int]:
    view = http.get("/admin/fleet", headers=ADMIN).json()
    loaded: dict[str, int] = {}
    for worker in view["workers"]:
        if worker["loaded"] and worker["switch"] is None:
            loaded[worker["model_config_name"]] = loaded.get(worker["model_config_name"], 0) + 1
    return loaded


async def burst(url: str, model: str, count: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        login = await client.get("/auth/callback/debug", params={"code": f"b-{uuid.uuid4().hex[:8]}"})
        client.headers["Authorization"] = f"Bearer {login.json()['access_token']['access_token']}"
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Count from one to twenty in words."}],
            "max_tokens": 48,
            "temperature": 0,
        }
        return await asyncio.gather(*(client.post("/v1/chat/completions", json=body) for _ in range(count)))


def watch_during(url: str, model: str, count: int) -> tuple[list[httpx.Response], list[tuple[float, dict]]]:
    """The burst's answers and the workers per model seen every half second while it ran."""
    seen: list[tuple[float, dict]] = []

    async def run() -> list[httpx.Response]:
        task = asyncio.create_task(burst(url, model, count))
        started = time.monotonic()
        with httpx.Client(base_url=url, timeout=30) as http:
            while not task.done():
                seen.append((time.monotonic() - started, await asyncio.to_thread(workers_per_model, http)))
                await asyncio.sleep(0.5)
        return await task

    return asyncio.run(run()), seen


def test_workers_follow_a_burst_and_a_keeps_its_minimum(fleet: Stack) -> None:
    answers, seen = watch_during(fleet.url, B, BURST)
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200]
    assert all(a.json()["model"] == B and a.json()["choices"][0]["message"]["content"] for a in answers)
    assert all(a.json()["choices"][0]["finish_reason"] in ("length", "stop") for a in answers)
    # B got two workers within the bound; A never had fewer than its minimum once the fleet settled.
    reached = [t for t, counts in seen if counts.get(B, 0) >= 2]
    assert reached and reached[0] <= BOUND_SECONDS, seen
    print(f"B had two workers {reached[0]:.1f} s after its burst began")
    assert all(counts.get(A, 0) >= 1 for _, counts in seen), seen

    # Demand moves back to A: its workers come back (the cooldown has passed), every answer completes.
    time.sleep(6)
    answers, seen = watch_during(fleet.url, A, BURST)
    assert all(a.status_code == 200 and a.json()["model"] == A for a in answers)
    assert max(counts.get(A, 0) for _, counts in seen) >= 2, seen
    with httpx.Client(base_url=fleet.url) as http:
        decisions = http.get("/admin/rebalancer", headers=ADMIN).json()["decisions"]
    # Two bursts need at most two moves each way; a fleet that flapped would have made many more.
    assert 1 <= len(decisions) <= 6, decisions
    print(f"{len(decisions)} rebalancer decisions: {decisions}")


def test_a_model_left_below_its_minimum_gets_it_back(fleet: Stack) -> None:
    """Every worker of A moved to B by hand (the admin API): with nothing asked of either model, the
    rebalancer's minimum rule gives A a worker back within the bound."""
    with httpx.Client(base_url=fleet.url, timeout=30) as http:
        for worker in http.get("/admin/fleet", headers=ADMIN).json()["workers"]:
            if worker["model_config_name"] == A and worker["loaded"]:
                move = {"session_id": worker["session_id"], "model_config_name": B, "reason": "admin test"}
                response = http.post("/admin/fleet/moves", json=move, headers=ADMIN)
                assert response.status_code == 202, response.text
        started = time.monotonic()
        emptied = restored = None
        while time.monotonic() - started < BOUND_SECONDS:
            counts = workers_per_model(http)
            if emptied is None and counts.get(A, 0) == 0:
                emptied = time.monotonic() - started
            if emptied is not None and counts.get(A, 0) >= 1:
                restored = time.monotonic() - started
                break
            time.sleep(0.3)
        assert emptied is not None and restored is not None, (emptied, restored, counts)
        decisions = http.get("/admin/rebalancer", headers=ADMIN).json()["decisions"]
    assert decisions[-1]["kind"] == "minimum" and decisions[-1]["to_model"] == A, decisions[-1]
    print(f"A had no worker {emptied:.1f} s after the moves and one again {restored - emptied:.1f} s later")
