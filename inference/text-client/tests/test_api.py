"""The REST client and its event streams, against the scripted server in conftest (real HTTP)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from oasst_shared.sampling import SamplingParameters
from oasst_shared.schemas import MessageEvent, PendingEvent, TokenEvent
from oasst_text_client import ApiError, ChatApiClient, ProtocolError, ServerUnreachable, StreamInterrupted

from .conftest import Connection, FakeChatServer


def make_client(server: FakeChatServer, **kwargs: Any) -> ChatApiClient:
    sleeps: list[float] = []
    client = ChatApiClient(server.url, sleep=sleeps.append, **kwargs)
    client.sleeps = sleeps  # type: ignore[attr-defined]
    client.login("tester")
    return client


def start_answer(client: ChatApiClient) -> tuple[str, str]:
    chat = client.create_chat()
    prompter = client.add_prompter_message(chat.id, "hi", None)
    assistant = client.add_assistant_message(
        chat.id, prompter.id, "fake-model", SamplingParameters(max_new_tokens=8), "Be brief."
    )
    return chat.id, assistant.id


def test_login_and_list_models(fake_server: FakeChatServer) -> None:
    with make_client(fake_server) as client:
        models = client.list_models()
    assert [m.name for m in models] == ["fake-model", "other-model"]
    assert models[0].parameter_configs[0].sampling_parameters.temperature == 0.7
    login = fake_server.requests[0]
    assert login.path == "/auth/callback/debug?code=tester"
    assert fake_server.requests[1].headers["Authorization"] == "Bearer tok-tester"


def test_requests_carry_the_documented_payloads(fake_server: FakeChatServer) -> None:
    with make_client(fake_server) as client:
        start_answer(client)
    bodies = {r.path.rsplit("/", 1)[-1]: r.body for r in fake_server.requests if r.method == "POST"}
    assert bodies["chats"] == {}
    assert bodies["prompter_message"] == {"parent_id": None, "content": "hi"}
    assert bodies["assistant_message"] == {
        "parent_id": bodies["assistant_message"]["parent_id"],
        "model_config_name": "fake-model",
        "sampling_parameters": {"max_new_tokens": 8, "stop": []},
        "system_prompt": "Be brief.",
    }


def test_a_complete_stream(fake_server: FakeChatServer) -> None:
    with make_client(fake_server) as client:
        chat_id, message_id = start_answer(client)
        events = list(client.stream_events(chat_id, message_id))
    assert isinstance(events[0], PendingEvent) and events[0].queue_position == 1
    assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == "Hello, world!"
    assert isinstance(events[-1], MessageEvent) and events[-1].message.content == "Hello, world!"


@pytest.mark.parametrize("kind", ["eof_after", "abort_after"])
def test_a_dropped_stream_resumes_from_the_last_event_id(fake_server: FakeChatServer, kind: str) -> None:
    fake_server.connections = [Connection(kind, after=2), Connection(kind, after=1)]
    with make_client(fake_server) as client:
        chat_id, message_id = start_answer(client)
        events = list(client.stream_events(chat_id, message_id))
        assert len(client.sleeps) == 2  # type: ignore[attr-defined]
    # No event lost, none repeated.
    assert [e.event_type for e in events] == ["pending"] + ["token"] * 4 + ["message"]
    assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == "Hello, world!"
    stream_requests = [r for r in fake_server.requests if r.path.endswith("/events")]
    assert [r.headers.get("Last-Event-ID") for r in stream_requests] == [None, "2-0", "3-0"]


def test_a_stalled_stream_is_reopened(fake_server: FakeChatServer) -> None:
    fake_server.connections = [Connection("stall_after", after=3, stall_s=2.0)]
    with make_client(fake_server, stream_timeout=httpx.Timeout(0.5)) as client:
        chat_id, message_id = start_answer(client)
        events = list(client.stream_events(chat_id, message_id))
    assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == "Hello, world!"


def test_server_errors_on_the_stream_are_retried(fake_server: FakeChatServer) -> None:
    fake_server.connections = [Connection("status", status=503)]
    with make_client(fake_server) as client:
        chat_id, message_id = start_answer(client)
        events = list(client.stream_events(chat_id, message_id))
    assert isinstance(events[-1], MessageEvent)


def test_reconnecting_gives_up_after_the_limit_with_backoff(fake_server: FakeChatServer) -> None:
    fake_server.connections = [Connection("eof_after", after=1)] + [Connection("status", 503)] * 10
    with make_client(fake_server, max_reconnects=3) as client:
        chat_id, message_id = start_answer(client)
        with pytest.raises(StreamInterrupted, match="could not resume"):
            list(client.stream_events(chat_id, message_id))
        assert client.sleeps == [0.5, 1.0, 2.0]  # type: ignore[attr-defined]


def test_a_client_error_on_the_stream_is_not_retried(fake_server: FakeChatServer) -> None:
    with make_client(fake_server) as client:
        chat_id, _ = start_answer(client)
        with pytest.raises(ApiError) as exc_info:
            list(client.stream_events(chat_id, "no-such-message"))
    assert exc_info.value.status_code == 404
    assert str(exc_info.value) == "server error 404: message not found"


def test_error_detail_is_shown(fake_server: FakeChatServer) -> None:
    with make_client(fake_server) as client:
        chat = client.create_chat()
        prompter = client.add_prompter_message(chat.id, "hi", None)
        with pytest.raises(ApiError) as exc_info:
            client.add_assistant_message(chat.id, prompter.id, "nope", SamplingParameters())
    assert exc_info.value.status_code == 422
    assert exc_info.value.code == "unknown_model"
    assert exc_info.value.detail == "unknown model; available: fake-model, other-model"


def test_fastapi_validation_detail_is_flattened() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        detail = [{"loc": ["body", "content"], "msg": "String should have at least 1 character"}]
        return httpx.Response(422, json={"detail": detail})

    client = ChatApiClient("http://test", transport=httpx.MockTransport(handler))
    with pytest.raises(ApiError, match=r"422: content: String should have at least 1 character"):
        client.create_chat()


def test_a_non_json_error_body_is_shown_as_text() -> None:
    client = ChatApiClient(
        "http://test", transport=httpx.MockTransport(lambda r: httpx.Response(502, text="Bad"))
    )
    with pytest.raises(ApiError, match="502: Bad"):
        client.list_models()


def test_a_malformed_answer_is_a_protocol_error() -> None:
    client = ChatApiClient(
        "http://test", transport=httpx.MockTransport(lambda r: httpx.Response(200, json={}))
    )
    with pytest.raises(ProtocolError, match="unexpected chat from the server: id: Field required"):
        client.create_chat()


def test_unreachable_server(closed_port_url: str) -> None:
    with ChatApiClient(closed_port_url) as client, pytest.raises(ServerUnreachable) as exc_info:
        client.login("x")
    assert str(exc_info.value).startswith(f"cannot reach the inference server at {closed_port_url}")


def test_an_expired_token_is_renewed_once(fake_server: FakeChatServer) -> None:
    with make_client(fake_server) as client:
        client._http.headers["Authorization"] = "Bearer expired"
        assert client.list_models()
    paths = [r.path for r in fake_server.requests]
    assert paths[-3:] == [
        "/configs/model_configs",
        "/auth/callback/debug?code=tester",
        "/configs/model_configs",
    ]


def test_cancel(fake_server: FakeChatServer) -> None:
    with make_client(fake_server) as client:
        chat_id, message_id = start_answer(client)
        assert client.cancel_message(chat_id, message_id) is True
        fake_server.cancel_status = 405
        assert client.cancel_message(chat_id, message_id) is False
    assert fake_server.cancelled == [message_id, message_id]


def test_unknown_event_types_are_skipped() -> None:
    body = (
        'id: 1\ndata: {"event_type": "usage", "tokens": 3}\n\n'
        'id: 2\ndata: {"event_type": "token", "text": "a"}\n\n'
        'id: 3\ndata: {"event_type": "error", "error": "boom"}\n\n'
    )

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=body, headers={"Content-Type": "text/event-stream"})

    client = ChatApiClient("http://test", transport=httpx.MockTransport(handler))
    assert [e.event_type for e in client.stream_events("c", "m")] == ["token", "error"]


def test_a_malformed_known_event_is_a_protocol_error() -> None:
    body = 'id: 1\ndata: {"event_type": "token"}\n\n'
    client = ChatApiClient(
        "http://test", transport=httpx.MockTransport(lambda r: httpx.Response(200, text=body))
    )
    with pytest.raises(ProtocolError, match="malformed token event: text: Field required"):
        list(client.stream_events("c", "m"))
