"""The load generator's clients: the server's chat API (:class:`OurApi`), a text-generation-inference
backend and an OpenAI-compatible endpoint, each stream read into a :class:`StreamResult` (when each token
arrived, the text, how it ended)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx


def http_client(concurrency: int, timeout: float = 600.0) -> httpx.AsyncClient:
    """A client for ``concurrency`` requests at once; ``timeout``: the seconds a read (or a wait for a
    connection of the pool) may take, at least 600."""
    size = 2 * concurrency + 50
    timeout = max(timeout, 600.0)
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout, connect=60.0, pool=timeout),
        # Idle connections are dropped before uvicorn's 5 s keep-alive timeout closes them from its side:
        # a request sent on a connection the server is closing fails with a ReadError.
        limits=httpx.Limits(max_connections=size, max_keepalive_connections=size, keepalive_expiry=2.0),
    )


class BenchHttpError(Exception):
    pass


async def _retrying(call: Callable[[], Awaitable[httpx.Response]], attempts: int = 3) -> httpx.Response:
    """A setup request (login, new chat, prompt), sent again if the connection broke before an answer."""
    for attempt in range(attempts):
        try:
            return await call()
        except (httpx.ReadError, httpx.RemoteProtocolError, httpx.ConnectError):
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def _check(response: httpx.Response) -> Any:
    if response.status_code >= 300:
        raise BenchHttpError(
            f"HTTP {response.status_code} on {response.request.url.path}: {response.text[:200]}"
        )
    return response.json()


@dataclass
class StreamResult:
    """One streamed generation as a client saw it (times from time.perf_counter())."""

    started: float
    first_token: float | None = None
    last_token: float | None = None
    ended: float | None = None
    tokens: int = 0
    text: str = ""
    ok: bool = False
    error: str | None = None
    generated_tokens: int | None = None
    final: dict[str, Any] | None = None
    message_id: str | None = None
    retries: int = 0

    def count_token(self) -> None:
        """A token arrived now."""
        now = time.perf_counter()
        if self.first_token is None:
            self.first_token = now
        self.last_token = now
        self.tokens += 1

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.started

    @property
    def decode_rate(self) -> float | None:
        """Tokens per second after the first one."""
        if self.first_token is None or self.last_token is None or self.tokens < 2:
            return None
        span = self.last_token - self.first_token
        return (self.tokens - 1) / span if span > 0 else None


async def _sse_events(response: httpx.Response) -> Any:
    """(id, data) of each server-sent event of a response."""
    buffer = ""
    async for chunk in response.aiter_text():
        buffer += chunk
        if "\r" in buffer:
            buffer = buffer.replace("\r\n", "\n")
        while "\n\n" in buffer:
            block, buffer = buffer.split("\n\n", 1)
            event_id, data = None, []
            for line in block.split("\n"):
                if line.startswith("data:"):
                    data.append(line[5:].lstrip(" "))
                elif line.startswith("id:"):
                    event_id = line[3:].strip()
            if data:
                yield event_id, "\n".join(data)


class OurApi:
    """The server's chat API, as a load generator uses it."""

    def __init__(self, client: httpx.AsyncClient, base_url: str):
        self.client = client
        self.base = base_url.rstrip("/")

    async def login(self, username: str) -> str:
        response = await _retrying(
            lambda: self.client.get(f"{self.base}/auth/callback/debug", params={"code": username})
        )
        return str(_check(response)["access_token"]["access_token"])

    @staticmethod
    def auth(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    async def create_chat(self, token: str) -> str:
        response = await _retrying(
            lambda: self.client.post(f"{self.base}/chats", json={}, headers=self.auth(token))
        )
        return str(_check(response)["id"])

    async def prompter(self, token: str, chat_id: str, parent_id: str | None, content: str) -> str:
        response = await _retrying(
            lambda: self.client.post(
                f"{self.base}/chats/{chat_id}/prompter_message",
                json={"parent_id": parent_id, "content": content},
                headers=self.auth(token),
            )
        )
        return str(_check(response)["id"])

    async def assistant(
        self, token: str, chat_id: str, parent_id: str, model: str, max_new_tokens: int
    ) -> str:
        response = await self.client.post(
            f"{self.base}/chats/{chat_id}/assistant_message",
            json={
                "parent_id": parent_id,
                "model_config_name": model,
                "sampling_parameters": {"do_sample": False, "max_new_tokens": max_new_tokens},
            },
            headers=self.auth(token),
        )
        return str(_check(response)["id"])

    async def ask(
        self, token: str, chat_id: str, parent_id: str, model: str, max_new_tokens: int, readers: int = 1
    ) -> StreamResult:
        """Queue an answer and stream it; timed from the assistant_message request.

        ``readers`` > 1 reads the answer with that many event streams at once (several tabs); the
        result is the first one's, failed if any of the others failed or saw other text.
        """
        result = StreamResult(started=time.perf_counter())
        try:
            message_id = await self.assistant(token, chat_id, parent_id, model, max_new_tokens)
            result.message_id = message_id
            others = [StreamResult(started=result.started) for _ in range(readers - 1)]
            await asyncio.gather(
                self.read_events(token, chat_id, message_id, result),
                *(self.read_events(token, chat_id, message_id, other) for other in others),
            )
            for other in others:
                if result.ok and (not other.ok or other.text != result.text):
                    result.ok = False
                    result.error = f"another reader of the answer: {other.error or 'other text'}"
        except (httpx.HTTPError, BenchHttpError, ValueError) as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        result.ended = result.ended or time.perf_counter()
        return result

    async def prompt_and_ask(
        self, token: str, chat_id: str, content: str, model: str, max_new_tokens: int
    ) -> StreamResult:
        """A turn in three requests (prompter_message, assistant_message, events), timed from the first."""
        started = time.perf_counter()
        try:
            parent_id = await self.prompter(token, chat_id, None, content)
        except (httpx.HTTPError, BenchHttpError, ValueError) as exc:
            return StreamResult(
                started=started, ended=time.perf_counter(), error=f"{type(exc).__name__}: {exc}"
            )
        result = await self.ask(token, chat_id, parent_id, model, max_new_tokens)
        result.started = started
        return result

    async def turn(
        self, token: str, chat_id: str, content: str, model: str, max_new_tokens: int
    ) -> StreamResult:
        """A turn in one request (``POST /chats/{id}/turns``), timed from it to the answer's last event."""
        result = StreamResult(started=time.perf_counter())
        body = {
            "parent_id": None,
            "content": content,
            "model_config_name": model,
            "sampling_parameters": {"do_sample": False, "max_new_tokens": max_new_tokens},
        }
        headers = {**self.auth(token), "Accept": "text/event-stream"}
        try:
            async with self.client.stream(
                "POST", f"{self.base}/chats/{chat_id}/turns", json=body, headers=headers
            ) as response:
                await self._read_answer(response, result)
        except (httpx.HTTPError, BenchHttpError, ValueError) as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        result.ended = result.ended or time.perf_counter()
        return result

    async def read_events(self, token: str, chat_id: str, message_id: str, result: StreamResult) -> None:
        url = f"{self.base}/chats/{chat_id}/messages/{message_id}/events"
        headers = {**self.auth(token), "Accept": "text/event-stream"}
        async with self.client.stream("GET", url, headers=headers) as response:
            await self._read_answer(response, result)

    @staticmethod
    async def _read_answer(response: httpx.Response, result: StreamResult) -> None:
        """Read an answer's server-sent events into ``result``, to its terminal event."""
        if response.status_code != 200:
            await response.aread()
            raise BenchHttpError(f"HTTP {response.status_code} on {response.url.path}: {response.text[:200]}")
        parts: list[str] = []
        async for _, data in _sse_events(response):
            if data.startswith('{"event_type":"token"'):
                result.count_token()
                parts.append(json.loads(data)["text"])
                continue
            event = json.loads(data)
            kind = event.get("event_type")
            if kind == "created":
                result.message_id = event["assistant_message"]["id"]
            elif kind == "retry":
                # Another worker starts over: the tokens so far are void (the first one was still seen).
                parts.clear()
                result.tokens = 0
                result.retries += 1
            elif kind in ("message", "error"):
                result.ended = time.perf_counter()
                result.final = event
                message = event.get("message") or {}
                result.generated_tokens = message.get("generated_tokens")
                result.text = "".join(parts)
                if kind == "message" and message.get("state") == "complete":
                    result.ok = True
                else:
                    result.error = f"{kind}: {event.get('error') or message.get('state')}"
                return
        result.text = "".join(parts)
        result.error = "the event stream ended without a terminal event"


async def stream_tgi(
    client: httpx.AsyncClient, backend_url: str, prompt: str, max_new_tokens: int
) -> StreamResult:
    """Generate straight from a text-generation-inference backend (POST /generate_stream)."""
    result = StreamResult(started=time.perf_counter())
    body = {"inputs": prompt, "parameters": {"do_sample": False, "max_new_tokens": max_new_tokens}}
    parts: list[str] = []
    try:
        async with client.stream("POST", f"{backend_url}/generate_stream", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                raise BenchHttpError(f"HTTP {response.status_code}: {response.text[:200]}")
            async for _, data in _sse_events(response):
                event = json.loads(data)
                if "error" in event:
                    raise BenchHttpError(str(event["error"]))
                result.count_token()
                token = event.get("token") or {}
                if not token.get("special"):
                    parts.append(token.get("text", ""))
                if event.get("details"):
                    result.generated_tokens = event["details"].get("generated_tokens")
                    result.ok = True
        if not result.ok:
            result.error = "the stream ended without details"
    except (httpx.HTTPError, BenchHttpError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    result.text = "".join(parts)
    result.ended = time.perf_counter()
    return result


async def stream_openai(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    messages: list[dict[str, str]],
    max_tokens: int,
    api_key: str | None = None,
) -> StreamResult:
    """A streamed OpenAI chat completion (``base_url`` ends before ``/v1``)."""
    result = StreamResult(started=time.perf_counter())
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": True, "temperature": 0}
    parts: list[str] = []
    try:
        async with client.stream(
            "POST", f"{base_url}/v1/chat/completions", json=body, headers=headers
        ) as response:
            if response.status_code != 200:
                await response.aread()
                raise BenchHttpError(f"HTTP {response.status_code}: {response.text[:200]}")
            async for _, data in _sse_events(response):
                if data.strip() == "[DONE]":
                    result.ok = True
                    break
                event = json.loads(data)
                if "error" in event:
                    raise BenchHttpError(str(event["error"])[:200])
                for choice in event.get("choices") or []:
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        result.count_token()
                        parts.append(content)
        if not result.ok:
            result.error = "the stream ended without [DONE]"
    except (httpx.HTTPError, BenchHttpError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    result.text = "".join(parts)
    result.generated_tokens = result.tokens
    result.ended = time.perf_counter()
    return result
