"""A TCP proxy that drops a connection mid-response: the network fault of the stream-resume tests.

Bytes pass unchanged both ways. The first connection whose response bytes hold ``marker`` ``count``
times is aborted (a TCP reset) right after the chunk that completes the count, as a dropped network
would; ``cut`` is then set. Every other connection passes through. Protocol-agnostic: it works for
any HTTP stream (SSE events, chunked bodies) without parsing it.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from urllib.parse import urlsplit

_CHUNK = 4096


def _abort(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0), not a clean end of stream. The shutdown comes first: another
    thread blocked in ``recv`` on this socket would otherwise keep it open after ``close`` (the kernel
    releases a socket only when no call holds it), and the client would see no cut until its timeout."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


class CuttingProxy:
    def __init__(self, upstream: str, marker: bytes, count: int):
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._marker = marker
        self._count = count
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.cut = threading.Event()
        self._claimed = threading.Lock()  # the one connection that gets cut
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="cutting-proxy").start()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()

    def __enter__(self) -> CuttingProxy:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._upstream)
            except OSError:
                _abort(client)
                continue
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._relay_response, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(_CHUNK):
                target.sendall(data)
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)

    def _relay_response(self, upstream: socket.socket, client: socket.socket) -> None:
        seen, tail = 0, b""
        try:
            while data := upstream.recv(_CHUNK):
                client.sendall(data)
                if self.cut.is_set():
                    continue
                window = tail + data
                seen += window.count(self._marker) - tail.count(self._marker)
                tail = window[-(len(self._marker) - 1) :] if len(self._marker) > 1 else b""
                if seen >= self._count and self._claimed.acquire(blocking=False):
                    self.cut.set()
                    _abort(client)
                    _abort(upstream)
                    return
        except OSError:
            pass
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_WR)
