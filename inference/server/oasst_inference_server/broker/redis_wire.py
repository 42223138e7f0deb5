"""A bare pipelined Redis connection for the per-token commands: the relay's append and the stream read.

redis-py spends about 100 µs of CPU on each command beyond the socket work (a pool checkout, a task
per ``wait_for``, its script and response machinery); at the model's pace every token is one append
and one read, so that was most of what a relayed token cost the server. :class:`RespWire` writes the
command hiredis packs in C straight to an asyncio transport and hands each reply hiredis parses to the
future that waits for it, in order: about 20 µs a command. It knows nothing else: what the commands
mean, retries and fallbacks stay with the broker (:mod:`.redis`), which uses redis-py for the rest.

Replies are RESP2 with strings decoded (what the broker's redis-py client returns). A Redis error reply
raises :class:`WireReplyError`; a lost, unreachable or timed-out connection :class:`WireClosed` (every
command waiting on it fails alike; the next call connects again), :class:`WireTimeout` when the reply
did not come in time. A caller cancelled while it waits
leaves the connection as it is: the reply, when it comes, is dropped.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any
from urllib.parse import unquote, urlparse, urlsplit, urlunsplit

import hiredis


class WireClosed(ConnectionError):
    """The connection is lost, could not be made or timed out: the command may or may not have run."""


class WireTimeout(WireClosed):
    """No reply in time: the command may have run (an append must not be sent again)."""


class WireReplyError(Exception):
    """Redis answered the command with an error (``NOSCRIPT ...``, ``WRONGTYPE ...``)."""


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.reader = hiredis.Reader(encoding="utf-8")
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.transport: asyncio.Transport | None = None
        self.lost: BaseException | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        reader.feed(data)
        waiting = self.waiting
        try:
            while (reply := reader.gets()) is not False:
                if not waiting:
                    raise WireClosed("a reply nobody asked for")
                future = waiting.popleft()
                if not future.done():  # else its caller was cancelled: the reply is dropped
                    future.set_result(reply)
        except (hiredis.ProtocolError, WireClosed) as exc:
            self.fail(WireClosed(f"redis protocol error: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(WireClosed(f"connection lost: {exc}" if exc else "connection closed"))
        if not self.closed.done():
            self.closed.set_result(None)

    def fail(self, error: BaseException) -> None:
        if self.lost is None:
            self.lost = error
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(self.lost)
        if self.transport is not None:
            self.transport.abort()


class RespWire:
    """One connection to the Redis of ``url`` (``redis://[user:password@]host[:port][/db]``), made on the
    first call; every call waits at most ``timeout`` seconds for its reply (then the connection is
    dropped: ``WireClosed``). Use :func:`wire_for` to get one only for URLs it speaks."""

    def __init__(self, url: str, *, timeout: float, connect_timeout: float, client_name: str | None = None):
        parsed = urlparse(url)
        self._host = parsed.hostname or "localhost"
        self._port = parsed.port or 6379
        self._username = unquote(parsed.username) if parsed.username else None
        self._password = unquote(parsed.password) if parsed.password else None
        path = parsed.path.strip("/")
        self._db = int(path) if path else 0
        self._client_name = client_name
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Lock | None = None
        self._closed = False
        self.connections = 0  # connections made so far: a new one is a new Redis client (CLIENT ID)

    async def call(self, *args: str | int | float | bytes, reconnect: bool = True) -> Any:
        """Send one command and return its reply; raises ``WireReplyError`` or ``WireClosed``.

        Without ``reconnect``, a command finds the connection lost raises ``WireClosed`` rather than
        go on a new one (a command tied to the connection's client id)."""
        return await self.call_packed(_pack(*args), reconnect=reconnect)

    async def call_packed(self, command: bytes, *, reconnect: bool = True) -> Any:
        """:meth:`call` with the command already packed in RESP."""
        protocol = self._protocol
        if protocol is None or protocol.lost is not None:
            if not reconnect:
                raise WireClosed("not connected")
            protocol = await self._connect()
        return await self._call(protocol, command)

    async def connect(self) -> None:
        """Connect unless connected (:attr:`connections` counts the connections made)."""
        protocol = self._protocol
        if protocol is None or protocol.lost is not None:
            await self._connect()

    def drop(self) -> None:
        """Close the connection (a command cut short left a reply that would come to the next one)."""
        protocol, self._protocol = self._protocol, None
        if protocol is not None:
            protocol.fail(WireClosed("dropped"))

    async def close(self) -> None:
        """Close for good, once the socket is closed (a call after this raises ``WireClosed``)."""
        self._closed = True
        protocol = self._protocol
        self.drop()
        if protocol is not None:
            await protocol.closed

    async def _call(self, protocol: _Protocol, command: bytes) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        protocol.waiting.append(future)
        assert protocol.transport is not None
        protocol.transport.write(command)
        timer = loop.call_later(self._timeout, _time_out, protocol, future)
        try:
            reply = await future
        finally:
            timer.cancel()
        if isinstance(reply, hiredis.ReplyError):
            raise WireReplyError(str(reply))
        return reply

    async def _connect(self) -> _Protocol:
        if self._closed:
            raise WireClosed("closed")
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            current = self._protocol
            if current is not None and current.lost is None:
                return current  # another call connected meanwhile
            loop = asyncio.get_running_loop()
            try:
                _, protocol = await asyncio.wait_for(
                    loop.create_connection(_Protocol, self._host, self._port), self._connect_timeout
                )
            except (OSError, asyncio.TimeoutError) as exc:
                raise WireClosed(f"cannot connect to redis: {type(exc).__name__}: {exc}") from exc
            try:
                if self._password is not None:
                    auth = (self._username, self._password) if self._username else (self._password,)
                    await self._call(protocol, _pack("AUTH", *auth))
                if self._db:
                    await self._call(protocol, _pack("SELECT", self._db))
                if self._client_name:
                    await self._call(protocol, _pack("CLIENT", "SETNAME", self._client_name))
            except BaseException:
                protocol.fail(WireClosed("setting up the connection failed"))
                raise
            if self._closed:
                protocol.fail(WireClosed("closed"))
                raise WireClosed("closed")
            self._protocol = protocol
            self.connections += 1
            return protocol


def _pack(*args: Any) -> bytes:
    return hiredis.pack_command(args)


def _time_out(protocol: _Protocol, future: asyncio.Future[Any]) -> None:
    if not future.done():
        protocol.fail(WireTimeout("redis did not answer in time"))


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***``, for logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + netloc))


def wire_for(url: str, *, timeout: float, connect_timeout: float, client_name: str | None) -> RespWire | None:
    """A :class:`RespWire` for a plain ``redis://`` URL without query options; None for any other (TLS,
    a unix socket, options): those keep redis-py for every command."""
    parsed = urlparse(url)
    if parsed.scheme != "redis" or parsed.query or parsed.fragment:
        return None
    try:
        path = parsed.path.strip("/")
        if path:
            int(path)
        parsed.port  # noqa: B018 - raises ValueError for a malformed port
    except ValueError:
        return None
    return RespWire(url, timeout=timeout, connect_timeout=connect_timeout, client_name=client_name)
