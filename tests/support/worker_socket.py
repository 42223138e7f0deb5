"""A stand-in for the server side of a worker's websocket, and waiting helpers, for tests that drive a
real ``WorkerConnection`` in-process."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.websockets import WebSocketState

from oasst_inference_server import events
from oasst_inference_server.workers.key_limits import KeyLimits
from oasst_inference_server.workers.worker_connection import WorkerConnection
from oasst_shared.model_configs import SMOLLM2_135M, ModelConfig
from oasst_shared.protocol import (
    PROTOCOL_VERSION,
    ServableModel,
    WorkerCapabilities,
    WorkerInfo,
    dump_frame,
)


class StandInSocket:
    """The server side of a worker's websocket: records what the server sends (pings aside), feeds what
    the worker says. ``fail_sends`` makes every send fail as on a closed socket; ``stall_sends`` makes
    every send wait forever, as on a socket whose buffers are full because the worker does not read."""

    def __init__(self, fail_sends: bool = False, stall_sends: bool = False) -> None:
        self.application_state = WebSocketState.CONNECTED
        self.sent: list[dict[str, Any]] = []
        self.incoming: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.fail_sends = fail_sends
        self.stall_sends = stall_sends
        self.closed_with: int | None = None

    async def send_text(self, text: str) -> None:
        if self.fail_sends:
            raise RuntimeError("Cannot call send once a close message has been sent.")
        if self.stall_sends:
            await asyncio.Event().wait()
        frame = json.loads(text)
        if frame["type"] != "ping":  # pings come on a timer: not what these tests look at
            self.sent.append(frame)

    async def receive(self) -> dict[str, Any]:
        return await self.incoming.get()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed_with = code
        if self.stall_sends:
            await asyncio.Event().wait()  # the close frame cannot go out either
        self.application_state = WebSocketState.DISCONNECTED

    def say(self, frame: Any) -> None:
        self.incoming.put_nowait({"type": "websocket.receive", "text": dump_frame(frame)})

    def hang_up(self) -> None:
        self.incoming.put_nowait({"type": "websocket.disconnect", "code": 1000})

    def sent_types(self) -> list[str]:
        return [frame["type"] for frame in self.sent]


async def until(condition: Callable[[], Awaitable[bool] | bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while True:
            result = condition()
            if result if isinstance(result, bool) else await result:
                return
            await asyncio.sleep(0.01)


async def stream_types(app: Any, message_id: str) -> list[str]:
    entries = await app.state.broker.read_events(events.stream_name(message_id), None, 0)
    return [json.loads(entry.data)["event_type"] for entry in entries]


def stand_in_connection(
    app: Any,
    model: str,
    socket: StandInSocket,
    dispatcher: Any,
    *,
    slots: int = 1,
    settings: Any = None,
    capabilities: WorkerCapabilities | None = None,
    protocol_version: int = PROTOCOL_VERSION,
    config: dict[str, Any] | None = None,
) -> WorkerConnection:
    """A real ``WorkerConnection`` of the app (its settings, unless given; its broker and lifecycle) for
    a worker of ``model`` (SmolLM2's config with ``config``'s changes) with ``slots`` slots on
    ``socket``, speaking ``protocol_version``, attached to ``dispatcher`` when run."""
    info = WorkerInfo(
        model_config=SMOLLM2_135M.model_copy(update={**(config or {}), "name": model}),
        max_parallel_requests=slots,
        backend_kind="fake",
        capabilities=capabilities or WorkerCapabilities(),
    )
    return WorkerConnection(
        socket,  # type: ignore[arg-type]
        info,
        settings=settings or app.state.settings,
        broker=app.state.broker,
        lifecycle=app.state.lifecycle,
        dispatcher=dispatcher,
        protocol_version=protocol_version,
    )


def model_config(name: str, **changes: Any) -> ModelConfig:
    """SmolLM2's config under another name (and ``changes``)."""
    return SMOLLM2_135M.model_copy(update={**changes, "name": name})


def switchable_info(
    model: str,
    servable: list[str],
    *,
    loaded: bool = True,
    slots: int = 1,
    load_seconds: float | None = None,
    changes: dict[str, dict[str, Any]] | None = None,
) -> WorkerInfo:
    """A protocol 6 worker's ``worker_info``: serving ``model`` (or, not ``loaded``, having served it) and
    able to switch to each of ``servable``; ``changes``: per model name, fields of its config."""
    changes = changes or {}
    return WorkerInfo(
        model_config=model_config(model, **changes.get(model, {})),
        max_parallel_requests=slots,
        backend_kind="fake",
        servable=[
            ServableModel(config=model_config(name, **changes.get(name, {})), load_seconds=load_seconds)
            for name in servable
        ],
        loaded=loaded,
    )


def switchable_connection(
    app: Any,
    info: WorkerInfo,
    socket: StandInSocket,
    *,
    settings: Any = None,
    protocol_version: int = PROTOCOL_VERSION,
    key_limits: KeyLimits | None = None,
) -> WorkerConnection:
    """A real ``WorkerConnection`` of the app for a worker announcing ``info``, with the app's dispatchers
    (a switch moves it from one model's dispatcher to another's)."""
    dispatchers = app.state.dispatchers
    return WorkerConnection(
        socket,  # type: ignore[arg-type]
        info,
        settings=settings or app.state.settings,
        broker=app.state.broker,
        lifecycle=app.state.lifecycle,
        dispatcher=dispatchers.for_model(info.model_config_.name),
        dispatchers=dispatchers,
        protocol_version=protocol_version,
        key_limits=key_limits,
    )
