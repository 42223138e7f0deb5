"""Below the edge guard, where uvicorn reads a request's head: a deadline, a size and a cap on connections.

uvicorn's HTTP protocol (httptools) waits as long as a client takes to send its request line and headers,
reads a head of any size (measured with uvicorn 0.55: a 20 MB header was read whole) and, unless told,
caps no connections: a client that sends one byte a second holds a connection for ever, and a few thousand
such clients use up the process's file descriptors (slowloris). Its ``timeout_keep_alive`` only closes
connections that send nothing after a response. :class:`GuardedHttpToolsProtocol`, the protocol that
``serve`` runs uvicorn with in every way the server is started, adds:

- a deadline for the whole head (``request_header_timeout``), from when the connection opens and from
  the first byte of each later request on it: past it the client gets 408 and the connection closes (a
  response still being written for an earlier request on it finishes first);
- a size for the head (``max_request_header_bytes``: request line and headers): past it 431, and the
  connection closes;
- a cap on the process's open connections (``max_connections``: HTTP requests, event streams and worker
  sockets alike): a connection that opens when the cap is reached is answered 503 with ``Retry-After``
  once its head is read (within the deadline above), and closed. The connections already open go on
  untouched, which uvicorn's own ``limit_concurrency`` does not do: it refuses any request, on any
  connection, while as many connections or requests are open.

The body is the edge guard's (:mod:`.edge_guard`: its size, its deadline, its content).
"""

from __future__ import annotations

import asyncio
import json
import resource
import time
from dataclasses import dataclass
from typing import Any, cast

import uvicorn
from loguru import logger
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from oasst_inference_server import metrics
from oasst_inference_server.api.error_handlers import error_response

# Descriptors a server process needs besides its clients' connections: the database pool, Redis
# connections, the listening socket, logs, the SQLite file and its journal.
RESERVED_DESCRIPTORS = 256
RETRY_AFTER_SECONDS = 1
_WARN_EVERY_SECONDS = 10.0


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float  # seconds for a whole request head
    max_header_bytes: int  # request line plus headers
    max_connections: int  # open at once in one process


def usable_connections(wanted: int) -> int:
    """``wanted``, or fewer if the open-file limit would not allow that many (after raising its soft
    value towards the hard one as far as needed: the soft limit is often 1,024 where the hard one is far
    higher). Past the limit ``accept`` fails, and so would the process's own database connections."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = wanted + RESERVED_DESCRIPTORS
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError) as exc:
            logger.warning("could not raise the open-file limit from {} to {}: {}", soft, raised, exc)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - RESERVED_DESCRIPTORS))


class GuardedConfig(uvicorn.Config):
    """uvicorn's configuration with the connection limits, which the protocol of every connection reads
    (it is pickled to the processes of a multi-process server with everything else)."""

    def __init__(self, app: Any, *, limits: ConnectionLimits, **options: Any) -> None:
        super().__init__(app, http=GuardedHttpToolsProtocol, **options)
        self.connection_limits = limits


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits: ConnectionLimits = cast(GuardedConfig, config).connection_limits
        self._in_head = True  # the bytes that arrive belong to a request's head
        self._head_bytes = 0
        self._head_deadline: asyncio.TimerHandle | None = None
        self._refusal: ASGIApp | None = None  # what answers this connection's request instead of the app

    # ------------------------------------------------------------ the connection
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        over_cap = len(self.connections) >= self.limits.max_connections
        super().connection_made(transport)
        if over_cap:
            max_connections = self.limits.max_connections
            self._refuse_request(
                503,
                "too_many_connections",
                f"this server process has its {max_connections} connections open "
                "(OASST_SERVER_MAX_CONNECTIONS); retry shortly",
                {"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
            metrics.CONNECTIONS_REFUSED.labels("over_cap").inc()
            _refusals.note(max_connections)
        self._arm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        # A head still arriving past the bound is cut off here (one read past it at most is held); a
        # whole head that arrived in one read is measured when it is complete.
        if (
            self._in_head
            and self._head_bytes > self.limits.max_header_bytes
            and not self.transport.is_closing()
        ):
            metrics.CONNECTIONS_REFUSED.labels("header_too_large").inc()
            if not self._end_after_response():
                self._refuse_head(431, "request_header_too_large", self._too_large())

    # ------------------------------------------------------------ the parser's callbacks
    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_deadline is None:  # a later request on this connection: its own deadline
            self._arm_head_deadline()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_head_deadline()
        if self._refusal is None and self._head_size() > self.limits.max_header_bytes:
            metrics.CONNECTIONS_REFUSED.labels("header_too_large").inc()
            self._refuse_request(431, "request_header_too_large", self._too_large())
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        # What arrives next is the head of the next request (its deadline starts with its first byte).
        self._in_head = True
        self._head_bytes = 0

    # ------------------------------------------------------------ refusals
    def _refuse_request(
        self, status: int, code: str, detail: str, headers: dict[str, str] | None = None
    ) -> None:
        """Answer this connection's request with an error instead of the app, then close it."""
        self._refusal = self.app = _refusal(status, code, detail, headers or {})

    def _should_upgrade(self) -> bool:
        # A refused websocket is answered like any request (an upgrade would go past the answer).
        return self._refusal is None and super()._should_upgrade()

    def _unsupported_upgrade_warning(self) -> None:
        if self._refusal is None:
            super()._unsupported_upgrade_warning()

    def _head_size(self) -> int:
        """The request line and headers as they came (give or take the spaces around the values)."""
        line = len(self.parser.get_method()) + len(self.url) + len(b"  HTTP/1.1\r\n")
        return line + sum(len(name) + len(value) + 4 for name, value in self.headers) + 2

    def _too_large(self) -> str:
        return (
            f"the request line and headers exceed {self.limits.max_header_bytes} bytes "
            "(OASST_SERVER_MAX_REQUEST_HEADER_BYTES)"
        )

    # ------------------------------------------------------------ the head's deadline
    def _arm_head_deadline(self) -> None:
        self._cancel_head_deadline()
        self._head_deadline = self.loop.call_later(self.limits.header_timeout, self._head_too_slow)

    def _cancel_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_too_slow(self) -> None:
        self._head_deadline = None
        if not self._in_head or self.transport.is_closing():
            return
        metrics.CONNECTIONS_REFUSED.labels("header_timeout").inc()
        if self._end_after_response():
            return
        self._refuse_head(
            408,
            "request_header_timeout",
            f"the request line and headers did not arrive within {self.limits.header_timeout:g} seconds "
            "(OASST_SERVER_REQUEST_HEADER_TIMEOUT)",
        )

    def _end_after_response(self) -> bool:
        """If an earlier request on this connection is still being answered (the late or large head is
        a pipelined one), let that answer finish, read nothing more, and close the connection after it;
        False if nothing is being answered."""
        if self.cycle is None or self.cycle.response_complete:
            return False
        self._in_head = False
        self._cancel_head_deadline()
        self.cycle.keep_alive = False
        self.flow.pause_reading()
        return True

    def _refuse_head(self, status: int, code: str, detail: str) -> None:
        """Answer a request whose head never became a request, and close (as uvicorn answers a head it
        cannot parse, in JSON like every other refusal)."""
        self._in_head = False
        self._cancel_head_deadline()
        body = json.dumps({"detail": detail, "code": code}).encode()
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        self.transport.close()


def _refusal(status: int, code: str, detail: str, headers: dict[str, str]) -> ASGIApp:
    async def refuse(scope: Scope, receive: Receive, send: Send) -> None:
        closing = {**headers, "Connection": "close"}
        await error_response(scope["path"], status, code, detail, closing)(scope, receive, send)

    return refuse


class _Refusals:
    """One warning every few seconds while connections are refused, not one per connection."""

    def __init__(self) -> None:
        self.count = 0
        self.warned_at = 0.0

    def note(self, max_connections: int) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self.warned_at >= _WARN_EVERY_SECONDS:
            logger.warning(
                "{} connection(s) refused: this process has its {} connections open (OASST_SERVER_MAX_CONNECTIONS)",
                self.count,
                max_connections,
            )
            self.count = 0
            self.warned_at = now


_refusals = _Refusals()
