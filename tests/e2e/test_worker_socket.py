"""The worker websocket: handshake refusals and malformed frames affect only that connection."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from oasst_shared.model_configs import SMOLLM2_135M
from oasst_shared.protocol import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    Drain,
    GeneratedText,
    Token,
    TokenBatch,
    WorkerError,
    WorkerInfo,
    dump_frame,
)
from tests.e2e.chat_api import ChatApi
from tests.support.processes import wait_for_model
from tests.support.stacks import WORKER_API_KEY

pytestmark = pytest.mark.slow


@pytest.fixture(params=["embedded", "production"])
def stack(request):
    return request.getfixturevalue(f"{request.param}_stack")


def headers(key: str = WORKER_API_KEY, version: int | str = PROTOCOL_VERSION) -> dict[str, str]:
    return {"X-API-Key": key, "X-Protocol-Version": str(version)}


def own_model_info() -> WorkerInfo:
    # A model of its own, so this fake worker is never handed a real chat's work.
    config = SMOLLM2_135M.model_copy(update={"name": f"fake-{uuid.uuid4().hex[:6]}"})
    return WorkerInfo(model_config=config, max_parallel_requests=1, backend_kind="fake")


def hello() -> str:
    return dump_frame(own_model_info())


@dataclass
class HeldWork:
    """A fake worker's socket, holding the work of one answer that a new user asked for."""

    ws: ClientConnection
    info: WorkerInfo
    api: ChatApi
    chat_id: str
    message_id: str
    work: dict[str, Any]  # the work frame


@asynccontextmanager
async def worker_holding_work(
    stack, prompt: str, max_new_tokens: int, version: int = PROTOCOL_VERSION
) -> AsyncIterator[HeldWork]:
    """A worker socket serving a model of its own; a new user asks it for an answer, and this waits
    until the socket receives that work."""
    info = own_model_info()
    async with connect(f"{stack.ws_url}/workers/work", additional_headers=headers(version=version)) as ws:
        await ws.send(dump_frame(info))
        await asyncio.to_thread(wait_for_model, stack.url, info.model_config_.name)
        api = ChatApi(stack.url, f"user-{uuid.uuid4().hex[:8]}")
        chat_id = api.create_chat()
        prompter = api.prompter(chat_id, prompt)
        prompter.raise_for_status()
        answer = api.assistant(
            chat_id, prompter.json()["id"], info.model_config_.name, max_new_tokens=max_new_tokens
        )
        answer.raise_for_status()
        while (frame := json.loads(await asyncio.wait_for(ws.recv(), 10)))["type"] != "work":
            pass  # pings
        yield HeldWork(ws, info, api, chat_id, answer.json()["id"], frame)


async def test_wrong_api_key_is_refused(stack):
    with pytest.raises(InvalidStatus) as refused:
        await connect(f"{stack.ws_url}/workers/work", additional_headers=headers(key="wrong"))
    assert refused.value.response.status_code == 403


# "\u00b2" (a superscript two) is a digit to str.isdigit but not to int(); int() refuses 5,000 digits.
@pytest.mark.parametrize(
    "version", [0, PROTOCOL_VERSION + 1, "x", "\u00b2", "9" * 5000], ids=["0", "next", "x", "sup2", "huge"]
)
async def test_unsupported_protocol_version_is_told_to_upgrade(stack, version):
    async with connect(f"{stack.ws_url}/workers/work", additional_headers=headers(version=version)) as ws:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert frame["type"] == "upgrade_required" and "upgrade" in frame["detail"]
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 5)
        assert ws.close_code == 4000


@pytest.mark.parametrize(
    "first_frame",
    ["garbage", '{"type": "pong", "ping_id": "x", "free_slots": 1}', '{"type": "worker_info"}'],
)
async def test_a_bad_first_frame_closes_with_policy_violation(stack, first_frame):
    async with connect(f"{stack.ws_url}/workers/work", additional_headers=headers()) as ws:
        await ws.send(first_frame)
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 5)
        assert ws.close_code == 1008


async def test_a_malformed_frame_closes_only_that_connection(stack):
    async with connect(f"{stack.ws_url}/workers/work", additional_headers=headers()) as ws:
        await ws.send(hello())
        await ws.send('{"type": "token", "message_id": 5}')
        with pytest.raises(ConnectionClosed):
            while True:
                await asyncio.wait_for(ws.recv(), 5)  # pings may arrive first
        assert ws.close_code == 1008
    # The server and its real worker are unaffected: a chat still gets an answer.
    async with httpx.AsyncClient(base_url=stack.url) as client:
        assert (await client.get("/health")).status_code == 200
    api = ChatApi(stack.url, f"user-{uuid.uuid4().hex[:8]}")
    chat_id = api.create_chat()
    _, events = await asyncio.to_thread(api.ask, chat_id, "Hi!", stack.model_name, max_new_tokens=4)
    assert events[-1].data["event_type"] == "message"
    assert events[-1].data["message"]["state"] == "complete"


@pytest.mark.parametrize("version", [1, PROTOCOL_VERSION])
async def test_token_frames_and_token_batches_reach_readers_alike(stack, version):
    """A protocol-1 worker sends a frame per token; a protocol-2 worker may batch them."""
    async with worker_holding_work(stack, "Spell it", 8, version) as held:
        ws, api, chat_id, message_id = held.ws, held.api, held.chat_id, held.message_id
        assert held.work["message_id"] == message_id
        pieces = ["Hel", "lo", ",", " wor", "ld"]
        tokens = [Token(message_id=message_id, text=p) for p in pieces]
        if version == 1:
            for token in tokens:
                await ws.send(dump_frame(token))
        else:
            await ws.send(dump_frame(tokens[0]))
            await ws.send(dump_frame(TokenBatch(tokens=tokens[1:])))
        result = GeneratedText(
            message_id=message_id, text="".join(pieces), finish_reason="eos_token", generated_tokens=5
        )
        await ws.send(dump_frame(result))
        events = await asyncio.to_thread(api.events, chat_id, message_id)
    assert [e.data["text"] for e in events if e.data["event_type"] == "token"] == pieces
    assert events[-1].data["event_type"] == "message"
    assert events[-1].data["message"]["state"] == "complete"
    assert events[-1].data["message"]["content"] == "Hello, world"


# ---------------------------------------------------------------- the worker-socket fuzzer


def fuzz_frames(victim_message_id: str) -> list[str | bytes]:
    """Malformed, oversized, out-of-order, wrong-type and wrong-message frames, sent after worker_info."""
    other = "m-" + uuid.uuid4().hex[:8]
    nested = "[" * 5000 + "]" * 5000
    return [
        "garbage",
        "",
        "null",
        "[]",
        "{}",
        nested,
        '{"type": "no_such_frame"}',
        '{"type": "token"}',
        '{"type": "token", "message_id": 5, "text": "x"}',
        '{"type": "token", "message_id": "' + "x" * 100 + '", "text": "x"}',
        '{"type": "token_batch", "tokens": []}',
        '{"type": "token_batch", "tokens": [1, "a", null]}',
        '{"type": "pong", "ping_id": "p", "free_slots": -1}',
        '{"type": "pong", "ping_id": "p", "free_slots": 1e400}',
        '{"type": "generated_text", "message_id": "x", "text": "t", "finish_reason": "sideways", '
        '"generated_tokens": 1}',
        '{"type": "token", "message_id": "' + other + '", "text": "\\ud800"}',
        '{"type": "token", "message_id": "' + other + '", "text": "nul \\u0000 here"}',
        b"\x00\x01binary",
        "x" * (MAX_FRAME_BYTES + 10),
        dump_frame(WorkerInfo(model_config=SMOLLM2_135M, max_parallel_requests=1, backend_kind="fake")),
        # Frames about a message this connection does not hold (another worker's): ignored.
        dump_frame(Token(message_id=victim_message_id, text=" HIJACKED")),
        dump_frame(TokenBatch(tokens=[Token(message_id=victim_message_id, text=" HIJACKED")])),
        dump_frame(WorkerError(message_id=victim_message_id, error="forged", retryable=False)),
        dump_frame(
            GeneratedText(
                message_id=victim_message_id, text="forged", finish_reason="length", generated_tokens=1
            )
        ),
        dump_frame(Drain()),
    ]


async def test_a_worker_socket_fuzzer_leaves_the_server_and_other_workers_untouched(stack):
    """A hostile worker sends every kind of bad frame, each on a fresh socket; meanwhile another
    worker streams an answer to a reader. The server stays healthy, and the answer arrives whole,
    in one attempt, with no retry."""
    async with worker_holding_work(stack, "Count", 64) as held:
        victim, info, api, chat_id, message_id = held.ws, held.info, held.api, held.chat_id, held.message_id
        reader = asyncio.create_task(asyncio.to_thread(api.events, chat_id, message_id))
        pieces = []
        closes: dict[str, int | None] = {}
        for index, bad in enumerate(fuzz_frames(message_id)):
            piece = f" t{index}"
            pieces.append(piece)
            await victim.send(dump_frame(Token(message_id=message_id, text=piece)))
            # The fuzzer serves the victim's model too: the server may consider it for that work.
            async with connect(
                f"{stack.ws_url}/workers/work", additional_headers=headers(), max_size=None
            ) as fuzzer:
                await fuzzer.send(hello() if index % 2 else dump_frame(info))
                try:
                    # The server may close the socket (1009) while a frame past its limit is still being
                    # written; the close code below is what is asserted, not when the close arrives.
                    await fuzzer.send(bad)
                    while True:
                        got = json.loads(await asyncio.wait_for(fuzzer.recv(), 0.5))
                        assert got["type"] in ("ping", "work", "cancel"), got
                except (asyncio.TimeoutError, ConnectionClosed):
                    pass
                closes[repr(bad)[:40]] = fuzzer.close_code
            async with httpx.AsyncClient(base_url=stack.url) as client:
                assert (await client.get("/health")).status_code == 200
        # Closes: only codes that name the peer's fault (or none: the frame was ignored).
        assert set(closes.values()) <= {None, 1003, 1008, 1009}, closes
        assert closes[repr("x" * (MAX_FRAME_BYTES + 10))[:40]] == 1009
        result = GeneratedText(
            message_id=message_id,
            text="".join(pieces),
            finish_reason="eos_token",
            generated_tokens=len(pieces),
        )
        await victim.send(dump_frame(result))
        events = await asyncio.wait_for(reader, 60)
        # The victim is still connected: it still gets pings.
        while json.loads(await asyncio.wait_for(victim.recv(), 30))["type"] != "ping":
            pass
    kinds = [e.data["event_type"] for e in events]
    assert "retry" not in kinds and kinds[-1] == "message"
    assert [e.data["text"] for e in events if e.data["event_type"] == "token"] == pieces
    final = events[-1].data["message"]
    assert final["state"] == "complete" and final["attempts"] == 1 and final["content"] == "".join(pieces)
