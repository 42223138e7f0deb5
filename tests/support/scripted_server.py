"""A stand-in for the inference server's side of the worker websocket: a real websocket server on a free
port that a real worker (``WorkerClient.run``) connects to, driven by the test frame by frame.

    async with ScriptedServer() as server:
        ... start a worker with server_url=server.url ...
        peer = await server.accept()
        info = await peer.receive()               # the worker's frames, parsed by the protocol's schema
        await peer.send(Work(...))
        frames = await peer.until(lambda f: isinstance(f, GeneratedText))
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType

from pydantic import BaseModel
from websockets.asyncio.server import Server, ServerConnection, serve

from oasst_shared.protocol import (
    API_KEY_HEADER,
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION_HEADER,
    AnyWorkerFrame,
    Token,
    TokenBatch,
    dump_frame,
    parse_worker_frame,
)

TIMEOUT = 120.0  # bounds a hang; not a speed assertion


class ScriptedPeer:
    """One worker connection: what it sent (every frame, parsed) and a way to answer."""

    def __init__(self, ws: ServerConnection) -> None:
        self.ws = ws
        self.received: list[AnyWorkerFrame] = []
        # Case-insensitive, as HTTP headers are.
        self.headers = {k.lower(): v for k, v in ws.request.headers.raw_items()} if ws.request else {}

    async def send(self, frame: BaseModel) -> None:
        await self.ws.send(dump_frame(frame))

    async def receive(self, timeout: float = TIMEOUT) -> AnyWorkerFrame:
        raw = await asyncio.wait_for(self.ws.recv(), timeout)
        frame = parse_worker_frame(raw)  # a frame off the schema fails the test here
        self.received.append(frame)
        return frame

    async def until(
        self, done: Callable[[AnyWorkerFrame], bool], timeout: float = TIMEOUT
    ) -> list[AnyWorkerFrame]:
        """The frames received up to and including the first one for which ``done`` is true."""
        frames: list[AnyWorkerFrame] = []
        async with asyncio.timeout(timeout):
            while True:
                frame = await self.receive()
                frames.append(frame)
                if done(frame):
                    return frames


def tokens_of(frames: list[AnyWorkerFrame], message_id: str) -> list[str]:
    """The token texts of one message among ``frames``, token batches unpacked."""
    texts: list[str] = []
    for frame in frames:
        tokens = (
            frame.tokens if isinstance(frame, TokenBatch) else [frame] if isinstance(frame, Token) else []
        )
        texts += [t.text for t in tokens if t.message_id == message_id]
    return texts


class ScriptedServer:
    def __init__(self) -> None:
        self._server: Server | None = None
        self._peers: asyncio.Queue[ScriptedPeer] = asyncio.Queue()
        self.url = ""

    async def __aenter__(self) -> ScriptedServer:
        self._server = await serve(
            self._handler, "127.0.0.1", 0, max_size=MAX_FRAME_BYTES, compression=None, ping_interval=None
        )
        port = next(iter(self._server.sockets)).getsockname()[1]
        self.url = f"ws://127.0.0.1:{port}"
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def accept(self, timeout: float = TIMEOUT) -> ScriptedPeer:
        """The next worker connection (its headers are checked as the server's handshake checks them)."""
        peer = await asyncio.wait_for(self._peers.get(), timeout)
        headers = peer.headers
        assert headers.get(API_KEY_HEADER.lower()) and headers.get(PROTOCOL_VERSION_HEADER.lower()), headers
        return peer

    async def _handler(self, ws: ServerConnection) -> None:
        self._peers.put_nowait(ScriptedPeer(ws))
        await ws.wait_closed()
