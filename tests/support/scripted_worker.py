"""A protocol 6 worker scripted by a test, on a real websocket to a real server: it answers pings, records
every other frame it is sent, and does what the test says (switch models with ``model_switch`` steps and a
new ``worker_info``, answer a job). For tests of the server's side of model switching; the real worker
(``oasst_worker``) is tested against the real backend elsewhere."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from oasst_shared.protocol import (
    PROTOCOL_VERSION,
    GeneratedText,
    ModelSwitch,
    Pong,
    Token,
    WorkerInfo,
    dump_frame,
)
from tests.support.stacks import WORKER_API_KEY

LOAD_STEPS = ("draining", "unloading", "quantizing", "loading", "starting", "ready")


class ScriptedWorker:
    def __init__(self, ws: ClientConnection, info: WorkerInfo) -> None:
        self.ws = ws
        self.info = info
        self.frames: list[dict[str, Any]] = []  # everything but pings, in order
        self._taken = 0  # frames handed out by next()
        self._arrived = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, ws_url: str, info: WorkerInfo, key: str = WORKER_API_KEY) -> ScriptedWorker:
        headers = {"X-API-Key": key, "X-Protocol-Version": str(PROTOCOL_VERSION)}
        ws = await connect(f"{ws_url}/workers/work", additional_headers=headers)
        await ws.send(dump_frame(info))
        return cls(ws, info)

    @property
    def close_code(self) -> int | None:
        return self.ws.close_code

    async def _read(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for text in self.ws:
                frame = json.loads(text)
                if frame["type"] == "ping":
                    free = self.info.max_parallel_requests if self.info.loaded else 0
                    await self.ws.send(dump_frame(Pong(ping_id=frame["ping_id"], free_slots=free)))
                    continue
                self.frames.append(frame)
                self._arrived.set()
        self._arrived.set()

    async def next(self, kind: str, timeout: float = 20.0) -> dict[str, Any]:
        """The next frame of ``kind`` not handed out yet (frames of other kinds before it are skipped)."""
        async with asyncio.timeout(timeout):
            while True:
                for index in range(self._taken, len(self.frames)):
                    if self.frames[index]["type"] == kind:
                        self._taken = index + 1
                        return self.frames[index]
                if self._reader.done():
                    raise ConnectionError(f"the socket closed ({self.close_code}) before a {kind} frame")
                self._arrived.clear()
                await self._arrived.wait()

    def sent(self, kind: str) -> list[dict[str, Any]]:
        return [frame for frame in self.frames if frame["type"] == kind]

    async def report(self, command: dict[str, Any], *steps: str, model: str | None = None) -> None:
        """``model_switch`` frames of ``steps`` for ``command`` (a ``load_model`` or ``unload_model``)."""
        name = model or command.get("model_config_name") or self.info.model_config_.name
        for step in steps:
            progress = {"tensors_done": 7, "tensors_total": 30} if step == "quantizing" else {}
            frame = ModelSwitch(
                request_id=command["request_id"], model_config_name=name, step=step, **progress
            )
            await self.ws.send(dump_frame(frame))

    async def announce(self, info: WorkerInfo) -> None:
        """The ``worker_info`` that ends a switch: what it serves now."""
        self.info = info
        await self.ws.send(dump_frame(info))

    async def answer(self, work: dict[str, Any], text: str) -> None:
        """Stream ``text`` a word at a time and finish the job."""
        message_id = work["message_id"]
        tokens = [word + " " for word in text.split()]
        for token in tokens:
            await self.ws.send(dump_frame(Token(message_id=message_id, text=token)))
        done = GeneratedText(
            message_id=message_id,
            text="".join(tokens),
            finish_reason="eos_token",
            generated_tokens=len(tokens),
        )
        await self.ws.send(dump_frame(done))

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.ws.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._reader, 5)
