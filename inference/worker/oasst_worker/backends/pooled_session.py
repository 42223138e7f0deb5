"""The backends' pooled HTTP session: one aiohttp session per backend, its connections kept open across
requests (a session per request cost a TCP connect and a session's setup per answer).

A connection goes back to the pool only once its response was read to the end (:func:`finish`); one
idle for :data:`KEEPALIVE_SECONDS` is closed first, before uvicorn's five seconds close it under a request.
Closing is final: a request after :meth:`PooledSession.close` (a tokenizer's answer still running on a
backend switched away from) fails as a connection error instead of opening a session nobody closes.
"""

from __future__ import annotations

import asyncio

import aiohttp
import msgspec
from aiohttp import ClientResponse, ClientTimeout

KEEPALIVE_SECONDS = 3.0

_encoder = msgspec.json.Encoder()


class PooledSession:
    """One backend's pooled HTTP session (made on first use, in the running event loop), sending
    ``headers`` with every request."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None) -> None:
        self._base_url = base_url.rstrip("/")
        self._headers = headers or {}
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    def _get(self) -> aiohttp.ClientSession:
        if self._session is None:
            if self._closed:
                raise aiohttp.ClientConnectionError("the backend's HTTP session is closed")
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_SECONDS)
            self._session = aiohttp.ClientSession(connector=connector, headers=self._headers)
        return self._session

    async def post(
        self, path: str, body: bytes, *, headers: dict[str, str] | None, timeout: ClientTimeout
    ) -> ClientResponse:
        """The response to a JSON POST (its headers read; the body is the caller's to read and to
        :func:`finish`)."""
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        return await self._get().post(
            f"{self._base_url}{path}", data=body, headers=all_headers, timeout=timeout
        )

    async def post_for_json(self, path: str, payload: object, *, timeout: float) -> object:
        """The JSON a 200 answer to a JSON POST holds; None for any other status, a failed request or a
        body that is not JSON (what the tokenizer's endpoints are asked: the caller does without)."""
        try:
            async with self._get().post(
                f"{self._base_url}{path}",
                data=_encoder.encode(payload),
                headers={"Content-Type": "application/json"},
                timeout=ClientTimeout(total=timeout),
            ) as response:
                if response.status != 200:
                    return None
                return msgspec.json.decode(await response.read())
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, msgspec.DecodeError):
            return None

    async def close(self) -> None:
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()


def finish(response: ClientResponse) -> None:
    """Give the response's connection back to the pool if its body was read to the end, else close it
    (a stream left early: closing it tells the backend to stop generating)."""
    if response.content.at_eof():
        response.release()
    else:
        response.close()
