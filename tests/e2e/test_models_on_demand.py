"""Models on demand with a real server (SQLite and the in-process broker; Postgres and Redis; two replicas)
and scripted protocol 6 workers on real websockets: ``/v1/models`` lists what the fleet can load, a request
for a model nobody has loaded waits in the queue (its stream says a worker is loading the model) while the
best worker is told to load it, and is answered once it has; an unknown model is a 404; a worker idle past
its model's keep_alive is unloaded; the admin API shows the fleet and moves a worker, from any replica."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.processes import ManagedProcess
from tests.support.scripted_worker import LOAD_STEPS, ScriptedWorker
from tests.support.services import REDIS_URL, fresh_database, fresh_redis_prefix
from tests.support.stacks import Stack, start_replicas, start_stack
from tests.support.worker_socket import switchable_info

pytestmark = pytest.mark.slow

ADMIN_TOKEN = "fleet-test-admin-token-0123456789abcdef"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
SERVER_SETTINGS = {
    "OASST_SERVER_ADMIN_ROOT_TOKEN": ADMIN_TOKEN,
    "OASST_SERVER_FLEET_INTERVAL": "0.3",
    "OASST_SERVER_PENDING_UPDATE_INTERVAL": "0.3",
}
UNUSED_BACKEND = "http://127.0.0.1:9"  # the workers here are scripted: no backend


@pytest.fixture(
    scope="module",
    params=["sqlite", pytest.param("postgres", marks=[pytest.mark.postgres, pytest.mark.redis])],
)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir = tmp_path_factory.mktemp(f"fleet-{request.param}")
    if request.param == "sqlite":
        stack = start_stack(
            log_dir,
            UNUSED_BACKEND,
            f"sqlite+aiosqlite:///{log_dir}/oasst.db",
            None,
            workers=0,
            **SERVER_SETTINGS,
        )
        yield stack
        stack.stop()
        return
    with fresh_database("oasst_fleet") as url, fresh_redis_prefix("test:fleet") as prefix:
        stack = start_stack(
            log_dir,
            UNUSED_BACKEND,
            url,
            REDIS_URL,
            workers=0,
            OASST_SERVER_REDIS_KEY_PREFIX=prefix,
            **SERVER_SETTINGS,
        )
        yield stack
        stack.stop()


def names(count: int) -> list[str]:
    tag = uuid.uuid4().hex[:6]
    return [f"fleet-{tag}-{chr(ord('a') + i)}" for i in range(count)]


async def signed_in(http: httpx.AsyncClient) -> None:
    login = await http.get("/auth/callback/debug", params={"code": f"user-{uuid.uuid4().hex[:8]}"})
    login.raise_for_status()
    http.headers["Authorization"] = f"Bearer {login.json()['access_token']['access_token']}"


async def listed(http: httpx.AsyncClient, timeout: float = 20.0, **wanted: dict[str, Any]) -> dict[str, Any]:
    """``/v1/models`` once each model of ``wanted`` is listed with those fields; its cards by id."""
    async with asyncio.timeout(timeout):
        while True:
            cards = {card["id"]: card for card in (await http.get("/v1/models")).json()["data"]}
            if all(
                name in cards and all(cards[name][k] == v for k, v in fields.items())
                for name, fields in wanted.items()
            ):
                return cards
            await asyncio.sleep(0.1)


async def fleet(base_url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
        response = await http.get("/admin/fleet", headers=ADMIN)
        assert response.status_code == 200, response.text
        return dict(response.json())


async def worker_of(base_url: str, model: str, timeout: float = 20.0) -> dict[str, Any]:
    """The fleet view's worker that serves (or last served) ``model``, once there is one."""
    async with asyncio.timeout(timeout):
        while True:
            for worker in (await fleet(base_url))["workers"]:
                if worker["model_config_name"] == model:
                    return dict(worker)
            await asyncio.sleep(0.1)


async def move(http: httpx.AsyncClient, session_id: str, model: str) -> None:
    """Tell a worker (by its session) to load ``model`` through the admin API: accepted."""
    moved = await http.post(
        "/admin/fleet/moves", json={"session_id": session_id, "model_config_name": model}, headers=ADMIN
    )
    assert moved.status_code == 202, moved.text


async def stream_chat(http: httpx.AsyncClient, model: str) -> tuple[str, str]:
    """(the raw stream, the answer's text) of a streamed chat completion."""
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "stream": True, "max_tokens": 8}
    raw, text = [], []
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            raw.append(line)
            if line.startswith("data: {"):
                for choice in json.loads(line[6:]).get("choices", []):
                    text.append(choice.get("delta", {}).get("content") or "")
    return "\n".join(raw), "".join(text)


async def chat_answer(http: httpx.AsyncClient, model: str) -> list[dict[str, Any]]:
    """The events of a chat API answer from ``model``, to the terminal one."""
    chat_id = (await http.post("/chats", json={})).json()["id"]
    prompt = await http.post(f"/chats/{chat_id}/prompter_message", json={"content": "Hi"})
    answer = await http.post(
        f"/chats/{chat_id}/assistant_message",
        json={"parent_id": prompt.json()["id"], "model_config_name": model, "sampling_parameters": {}},
    )
    assert answer.status_code == 200, answer.text
    received = []
    path = f"/chats/{chat_id}/messages/{answer.json()['id']}/events"
    async with http.stream("GET", path, headers={"Accept": "text/event-stream"}) as response:
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                received.append(json.loads(line[5:]))
                if received[-1]["event_type"] in ("message", "error"):
                    break
    return received


async def test_a_request_for_a_model_nobody_has_loaded_is_answered_after_a_worker_loads_it(server):
    serving, wanted = names(2)
    changes = {wanted: {"quantization": "q8_0"}}
    busy = await ScriptedWorker.connect(
        server.ws_url, switchable_info(serving, [serving, wanted], changes=changes)
    )
    idle = await ScriptedWorker.connect(
        server.ws_url, switchable_info(serving, [serving, wanted], loaded=False, slots=2, changes=changes)
    )
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            await signed_in(http)
            cards = await listed(http, **{serving: {"loaded": True}, wanted: {"loaded": False}})
            assert (cards[serving]["worker_count"], cards[wanted]["loadable_worker_count"]) == (1, 2)
            assert cards[wanted]["quantization"] == "q8_0"
            configs = {c["name"]: c for c in (await http.get("/configs/model_configs")).json()}
            assert (configs[wanted]["loaded"], configs[wanted]["quantization"]) == (False, "q8_0")
            unknown = await http.post(
                "/v1/chat/completions",
                json={"model": "no-such-model", "messages": [{"role": "user", "content": "Hi"}]},
            )
            assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"

            answer = asyncio.create_task(stream_chat(http, wanted))
            # The worker with no model loaded is told to load it, not the one serving another model.
            load = await idle.next("load_model")
            assert load["model_config_name"] == wanted and busy.sent("load_model") == []
            chat = asyncio.create_task(chat_answer(http, wanted))  # the chat API's answer waits too
            await asyncio.sleep(1.5)  # the waiting streams say what they wait for
            await idle.report(load, *LOAD_STEPS)
            await idle.announce(switchable_info(wanted, [serving, wanted], slots=2, changes=changes))
            for _ in range(2):
                work = await idle.next("work")
                assert work["model_config_name"] == wanted
                await idle.answer(work, "Loaded on demand")
            raw, text = await asyncio.wait_for(answer, 30)
            assert text == "Loaded on demand "
            assert "waiting for a worker to load the model" in raw
            chat_events = await asyncio.wait_for(chat, 30)
            assert any(e["event_type"] == "pending" and e.get("loading_model") for e in chat_events)
            assert chat_events[-1]["event_type"] == "message"
            assert chat_events[-1]["message"]["content"] == "Loaded on demand "
            cards = await listed(http, **{wanted: {"loaded": True}})
            assert cards[wanted]["worker_count"] == 1
    finally:
        await busy.close()
        await idle.close()


async def test_an_idle_worker_unloads_after_its_model_s_keep_alive(server):
    (model,) = names(1)
    info = switchable_info(model, [model], changes={model: {"keep_alive": 1.0}})
    worker = await ScriptedWorker.connect(server.ws_url, info)
    try:
        unload = await worker.next("unload_model", timeout=30)
        await worker.report(unload, "draining", "unloading", "ready")
        await worker.announce(
            switchable_info(model, [model], loaded=False, changes={model: {"keep_alive": 1.0}})
        )
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            await signed_in(http)
            cards = await listed(http, **{model: {"loaded": False}})
            assert cards[model]["loadable_worker_count"] == 1
        view = await worker_of(server.url, model)
        assert not view["loaded"] and view["last_switch"]["outcome"] == "unloaded"
        assert view["switch"] is None
    finally:
        await worker.close()


async def test_the_admin_api_shows_the_fleet_and_moves_a_worker(server):
    first, second = names(2)
    worker = await ScriptedWorker.connect(server.ws_url, switchable_info(first, [first, second]))
    try:
        view = await worker_of(server.url, first)
        assert view["loaded"] and view["switchable"] and view["switch"] is None
        assert sorted(s["name"] for s in view["servable"]) == [first, second]
        session_id = view["session_id"]
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as http:
            refusals = [
                ({"session_id": "ws-nobody", "model_config_name": second}, 404, "unknown_worker_session"),
                ({"session_id": session_id, "model_config_name": "not-listed"}, 409, "model_not_servable"),
                ({"session_id": session_id, "model_config_name": first}, 409, "already_loaded"),
                ({"session_id": session_id, "model_config_name": "bad name!"}, 422, None),
            ]
            for body, status, code in refusals:
                refused = await http.post("/admin/fleet/moves", json=body, headers=ADMIN)
                assert refused.status_code == status, refused.text
                if code is not None:
                    assert code in refused.text
            assert (await http.post("/admin/fleet/moves", json=refusals[0][0])).status_code == 401
            await move(http, session_id, second)
        load = await worker.next("load_model")
        await worker.report(load, "draining", "unloading", "quantizing")

        async def quantizing() -> bool:
            view = next(w for w in (await fleet(server.url))["workers"] if w["session_id"] == session_id)
            switch = view["switch"]
            return switch is not None and (switch["step"], switch["tensors_done"]) == ("quantizing", 7)

        async with asyncio.timeout(20):
            while not await quantizing():
                await asyncio.sleep(0.1)
        models = {m["name"]: m for m in (await fleet(server.url))["models"]}
        assert models[second]["loading_workers"] == 1
        await worker.report(load, "loading", "ready")
        await worker.announce(switchable_info(second, [first, second]))
        view = await worker_of(server.url, second)
        assert view["session_id"] == session_id and view["last_switch"]["outcome"] == "ready"
    finally:
        await worker.close()


@pytest.fixture
def replicas(tmp_path) -> Iterator[list[str]]:
    with fresh_database("oasst_fleet_replicas") as url, fresh_redis_prefix("test:fleet-replicas") as prefix:
        started: list[tuple[str, ManagedProcess]] = start_replicas(
            tmp_path, url, prefix, ("replica0", "replica1"), **SERVER_SETTINGS
        )
        try:
            yield [base for base, _ in started]
        finally:
            for _, process in started:
                process.stop()


@pytest.mark.postgres
@pytest.mark.redis
async def test_a_worker_is_moved_from_a_replica_that_does_not_hold_its_socket(replicas):
    holder, other = replicas
    first, second = names(2)
    worker = await ScriptedWorker.connect(
        holder.replace("http://", "ws://", 1), switchable_info(first, [first, second])
    )
    try:
        session_id = (await worker_of(other, first))["session_id"]
        async with httpx.AsyncClient(base_url=other, timeout=20) as http:
            await move(http, session_id, second)
            load = await worker.next("load_model")
            await worker.report(load, "draining", "loading", "ready")
            await worker.announce(switchable_info(second, [first, second]))
            await signed_in(http)
            cards = await listed(http, **{second: {"loaded": True}})
            assert first not in cards or not cards[first]["loaded"]
    finally:
        await worker.close()
