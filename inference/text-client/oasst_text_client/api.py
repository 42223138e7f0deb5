"""A synchronous client for the inference server's chat REST API and its event streams."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from oasst_shared.sampling import SamplingParameters
from oasst_shared.schemas import (
    TERMINAL_EVENT_TYPES,
    AuthCheckResponse,
    ChatRead,
    CreatedEvent,
    LoginResponse,
    MessageRead,
    ModelConfigInfo,
    StreamEvent,
)
from oasst_text_client._exceptions import ApiError, ProtocolError, ServerUnreachable, StreamInterrupted
from oasst_text_client.sse import LineSplitter, SSEDecoder

_ModelT = TypeVar("_ModelT", bound=BaseModel)

_STREAM_EVENT = TypeAdapter[StreamEvent](StreamEvent)
_MODEL_CONFIGS = TypeAdapter(list[ModelConfigInfo])
_KNOWN_EVENT_TYPES = frozenset({"created", "pending", "token", "retry", "message", "error"})

DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
# The server pings an idle event stream every 15 s or so; a stream silent for much longer is dead.
STREAM_TIMEOUT = httpx.Timeout(60.0, connect=10.0)
MAX_RECONNECTS = 5
MAX_BACKOFF_S = 8.0


@dataclass
class _StreamCursor:
    """Where a message's event stream got to, carried across reconnects."""

    last_event_id: str | None = None
    events_seen: int = 0
    server_retry_s: float | None = None
    answer_id: str | None = None  # of a turn, once its created event arrived


class ChatApiClient:
    """REST calls of one user against one server. Not thread-safe; use one per thread.

    ``stream_timeout`` bounds the silence on an event stream before it counts as dropped; ``sleep`` is
    injectable so that reconnect back-off can be tested without waiting.
    """

    def __init__(
        self,
        server_url: str,
        *,
        transport: httpx.BaseTransport | None = None,
        max_reconnects: int = MAX_RECONNECTS,
        stream_timeout: httpx.Timeout = STREAM_TIMEOUT,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.server_url = server_url.rstrip("/")
        self._http = httpx.Client(base_url=self.server_url, timeout=DEFAULT_TIMEOUT, transport=transport)
        self._username: str | None = None
        self._max_reconnects = max_reconnects
        self._stream_timeout = stream_timeout
        self._sleep = sleep

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ChatApiClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ REST

    def login(self, username: str) -> None:
        """Log in through the server's debug login (the user is created on first use)."""
        body = self._request("GET", "/auth/callback/debug", params={"code": username}, authenticated=False)
        token = _parse(LoginResponse, body, "login")
        self._http.headers["Authorization"] = f"Bearer {token.access_token.access_token}"
        self._username = username

    def use_api_key(self, key: str) -> None:
        """Sign in with a user's API key (it does not expire; a 401 means it was revoked)."""
        self._http.headers["Authorization"] = f"Bearer {key}"
        self._username = None

    def whoami(self) -> AuthCheckResponse:
        """The signed-in user (a 401 here means the key or token is not accepted)."""
        return _parse(AuthCheckResponse, self._request("GET", "/auth/check"), "sign-in check")

    def list_models(self) -> list[ModelConfigInfo]:
        body = self._request("GET", "/configs/model_configs")
        try:
            return _MODEL_CONFIGS.validate_python(body)
        except ValidationError as exc:
            raise ProtocolError(f"unexpected model list from the server: {_first_error(exc)}") from exc

    def create_chat(self) -> ChatRead:
        return _parse(ChatRead, self._request("POST", "/chats", json={}), "chat")

    def add_prompter_message(self, chat_id: str, content: str, parent_id: str | None) -> MessageRead:
        body = self._request(
            "POST", f"/chats/{chat_id}/prompter_message", json={"parent_id": parent_id, "content": content}
        )
        return _parse(MessageRead, body, "message")

    def add_assistant_message(
        self,
        chat_id: str,
        parent_id: str,
        model_config_name: str,
        sampling_parameters: SamplingParameters,
        system_prompt: str | None = None,
    ) -> MessageRead:
        payload: dict[str, Any] = {
            "parent_id": parent_id,
            "model_config_name": model_config_name,
            "sampling_parameters": sampling_parameters.model_dump(mode="json", exclude_none=True),
        }
        if system_prompt:
            payload["system_prompt"] = system_prompt
        body = self._request("POST", f"/chats/{chat_id}/assistant_message", json=payload)
        return _parse(MessageRead, body, "message")

    def get_message(self, chat_id: str, message_id: str) -> MessageRead:
        body = self._request("GET", f"/chats/{chat_id}/messages/{message_id}")
        return _parse(MessageRead, body, "message")

    def cancel_message(self, chat_id: str, message_id: str) -> bool:
        """Ask the server to stop generating. False when this server has no cancel endpoint."""
        try:
            self._request("POST", f"/chats/{chat_id}/messages/{message_id}/cancel")
        except ApiError as exc:
            if exc.status_code in (404, 405):
                return False
            if exc.status_code == 409:  # already finished: nothing left to cancel
                return True
            raise
        return True

    # ------------------------------------------------------------------ event stream

    def stream_turn(
        self,
        chat_id: str,
        content: str,
        parent_id: str | None,
        model_config_name: str,
        sampling_parameters: SamplingParameters,
        system_prompt: str | None = None,
    ) -> Generator[StreamEvent, None, None]:
        """One whole turn in one call (``POST /chats/{id}/turns``): the prompt and its answer are created
        together and the answer streams back, led by a ``created`` event with both messages. A stream
        that breaks after that is resumed from the answer's events route, as :meth:`stream_events` does.

        Raises ``ApiError`` with status 404/405 and no specific code from a server without the route.
        The turn is never sent twice: if the connection fails before the ``created`` event, whether the
        server made the turn is unknown, and ``ServerUnreachable`` says so.
        """
        payload: dict[str, Any] = {
            "parent_id": parent_id,
            "content": content,
            "model_config_name": model_config_name,
            "sampling_parameters": sampling_parameters.model_dump(mode="json", exclude_none=True),
        }
        if system_prompt:
            payload["system_prompt"] = system_prompt
        cursor = _StreamCursor()
        problem: str | None = None
        try:
            for attempt in range(2):
                try:
                    problem = yield from self._read_events("POST", f"/chats/{chat_id}/turns", cursor, payload)
                except ApiError as exc:
                    if exc.status_code == 401 and attempt == 0 and self._username is not None:
                        self.login(self._username)  # the token expired: once more, signed in again
                        continue
                    raise
                break
        except httpx.TransportError as exc:
            if cursor.answer_id is None:
                raise ServerUnreachable(_describe_transport_error(exc, self.server_url)) from exc
            problem = _describe_transport_error(exc, self.server_url)
        if problem is None:
            return
        if cursor.answer_id is None:
            raise ProtocolError("the server's turn stream did not start with a created event")
        answer_id = cursor.answer_id
        yield from self._resume(f"/chats/{chat_id}/messages/{answer_id}/events", cursor, problem)

    def stream_events(self, chat_id: str, message_id: str) -> Generator[StreamEvent, None, None]:
        """The events of one assistant message, ending with its terminal event.

        A dropped or stalled connection is reopened with ``Last-Event-ID`` (the id of the last event
        handed out, so none is repeated or skipped), with exponential back-off, up to ``max_reconnects``
        times in a row; any event received resets that count.
        """
        yield from self._resume(f"/chats/{chat_id}/messages/{message_id}/events", _StreamCursor(), None)

    def _resume(
        self, path: str, cursor: _StreamCursor, problem: str | None
    ) -> Generator[StreamEvent, None, None]:
        """Read ``path``'s events from ``cursor`` on, reconnecting as :meth:`stream_events` says; with a
        ``problem``, the previous connection broke on it (counted as the first failure)."""
        failures = 0
        if problem is not None:
            failures = 1
            self._sleep(cursor.server_retry_s if cursor.server_retry_s is not None else 0.5)
        while True:
            seen_before = cursor.events_seen
            try:
                problem = yield from self._read_events("GET", path, cursor)
            except httpx.TransportError as exc:
                problem = _describe_transport_error(exc, self.server_url)
            if problem is None:
                return
            failures = 1 if cursor.events_seen > seen_before else failures + 1
            if failures > self._max_reconnects:
                raise StreamInterrupted(f"lost the answer stream and could not resume it: {problem}")
            backoff = cursor.server_retry_s if cursor.server_retry_s is not None else 0.5
            self._sleep(min(MAX_BACKOFF_S, backoff * 2 ** (failures - 1)))

    def _read_events(
        self, method: str, path: str, cursor: _StreamCursor, json: Any = None
    ) -> Generator[StreamEvent, None, str | None]:
        """One connection's worth of events. Returns None after the terminal event, else what went wrong."""
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        if cursor.last_event_id is not None:
            headers["Last-Event-ID"] = cursor.last_event_id
        with self._http.stream(
            method, path, headers=headers, json=json, timeout=self._stream_timeout
        ) as response:
            if response.status_code >= 400:
                response.read()
                error = _api_error(response)
                if response.status_code < 500 or method != "GET":
                    raise error  # a refused turn (no worker, queue full...) is an answer, not a hiccup
                return str(error)  # a server in trouble (restarting, overloaded) may recover
            splitter = LineSplitter()
            decoder = SSEDecoder()
            for chunk in response.iter_text():
                for line in splitter.feed(chunk):
                    sse = decoder.decode(line)
                    if sse is None:
                        continue
                    if sse.retry_ms is not None:
                        cursor.server_retry_s = sse.retry_ms / 1000
                    if sse.id is not None:
                        cursor.last_event_id = sse.id
                    cursor.events_seen += 1
                    event = _parse_event(sse.data)
                    if event is None:
                        continue
                    if isinstance(event, CreatedEvent):
                        cursor.answer_id = event.assistant_message.id
                    yield event
                    if event.event_type in TERMINAL_EVENT_TYPES:
                        return None
        return "the event stream ended before the answer was finished"

    # ------------------------------------------------------------------ plumbing

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, str] | None = None,
        authenticated: bool = True,
    ) -> Any:
        response = self._send(method, path, json=json, params=params)
        if response.status_code == 401 and authenticated and self._username is not None:
            # The token expired: log in again once and repeat the call.
            self.login(self._username)
            response = self._send(method, path, json=json, params=params)
        if response.status_code >= 400:
            raise _api_error(response)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError as exc:
            raise ProtocolError(f"the server sent a non-JSON answer to {method} {path}") from exc

    def _send(self, method: str, path: str, *, json: Any, params: dict[str, str] | None) -> httpx.Response:
        try:
            return self._http.request(method, path, json=json, params=params)
        except httpx.TransportError as exc:
            raise ServerUnreachable(_describe_transport_error(exc, self.server_url)) from exc


def _describe_transport_error(exc: httpx.TransportError, server_url: str) -> str:
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return f"cannot reach the inference server at {server_url} ({exc or type(exc).__name__})"
    if isinstance(exc, httpx.TimeoutException):
        return f"the inference server at {server_url} did not answer in time"
    return f"connection to the inference server at {server_url} failed ({exc or type(exc).__name__})"


def _api_error(response: httpx.Response) -> ApiError:
    detail: str = response.reason_phrase or "error"
    code: str | None = None
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()
        if text:
            detail = text[:300]
    else:
        if isinstance(body, dict):
            raw = body.get("detail", detail)
            detail = raw if isinstance(raw, str) else _format_validation_detail(raw)
            code = body.get("code") if isinstance(body.get("code"), str) else None
    return ApiError(response.status_code, detail, code)


def _format_validation_detail(raw: Any) -> str:
    # FastAPI's default validation error: a list of {loc, msg, type}.
    if isinstance(raw, list):
        parts = []
        for item in raw:
            if isinstance(item, dict) and "msg" in item:
                loc = ".".join(str(p) for p in item.get("loc", []) if p != "body")
                parts.append(f"{loc}: {item['msg']}" if loc else str(item["msg"]))
            else:
                parts.append(str(item))
        return "; ".join(parts)
    return json.dumps(raw)


def _parse(model: type[_ModelT], body: Any, what: str) -> _ModelT:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise ProtocolError(f"unexpected {what} from the server: {_first_error(exc)}") from exc


def _parse_event(data: str) -> StreamEvent | None:
    """One event's JSON data; None for event types this client does not know (newer servers)."""
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise ProtocolError(f"the server sent an event that is not JSON: {data[:100]!r}") from exc
    if not isinstance(raw, dict) or raw.get("event_type") not in _KNOWN_EVENT_TYPES:
        return None
    try:
        return _STREAM_EVENT.validate_python(raw)
    except ValidationError as exc:
        kind = raw["event_type"]
        # The union reports the tag first ("token.text"); the kind is named already.
        raise ProtocolError(f"the server sent a malformed {kind} event: {_first_error(exc, 1)}") from exc


def _first_error(exc: ValidationError, skip: int = 0) -> str:
    error = exc.errors()[0]
    loc = ".".join(str(p) for p in error["loc"][skip:])
    return f"{loc}: {error['msg']}" if loc else error["msg"]
