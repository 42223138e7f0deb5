"""Bad input gets a clear JSON error with a code, never a 500."""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.e2e.chat_api import ChatApi
from tests.support.clients import closing

pytestmark = pytest.mark.slow


@pytest.fixture(params=["embedded", "production"])
def stack(request):
    return request.getfixturevalue(f"{request.param}_stack")


@pytest.fixture
def api(stack) -> ChatApi:
    return ChatApi(stack.url, f"user-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def prompt(api):
    chat_id = api.create_chat()
    response = api.prompter(chat_id, "hello")
    response.raise_for_status()
    return chat_id, response.json()["id"]


def assert_error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["code"] == code and isinstance(body["detail"], str) and body["detail"]
    return body


def test_unknown_model_lists_the_available_ones(stack, api, prompt):
    chat_id, prompter_id = prompt
    body = assert_error(api.assistant(chat_id, prompter_id, "no-such-model"), 400, "unknown_model")
    assert stack.model_name in body["detail"]


def test_another_users_chat_is_not_found(stack, api, prompt):
    chat_id, prompter_id = prompt
    message_id = api.assistant(chat_id, prompter_id, stack.model_name, max_new_tokens=2).json()["id"]
    other = ChatApi(stack.url, f"other-{uuid.uuid4().hex[:8]}")
    assert_error(other.client.get(f"/chats/{chat_id}"), 404, "chat_not_found")
    assert_error(other.prompter(chat_id, "hi", prompter_id), 404, "chat_not_found")
    assert_error(other.assistant(chat_id, prompter_id, stack.model_name), 404, "chat_not_found")
    assert_error(other.client.get(f"/chats/{chat_id}/messages/{message_id}"), 404, "chat_not_found")
    assert_error(other.client.get(f"/chats/{chat_id}/messages/{message_id}/events"), 404, "chat_not_found")
    assert_error(other.client.post(f"/chats/{chat_id}/messages/{message_id}/cancel"), 404, "chat_not_found")
    # And a message id from another chat of the same user is not found either.
    own_other_chat = api.create_chat()
    assert_error(api.client.get(f"/chats/{own_other_chat}/messages/{message_id}"), 404, "message_not_found")


def test_anonymous_and_bad_tokens_get_401(stack, api, prompt):
    chat_id, _ = prompt
    anonymous = closing(httpx.Client(base_url=stack.url))
    assert_error(anonymous.get("/chats"), 401, "not_authenticated")
    assert_error(anonymous.get(f"/chats/{chat_id}"), 401, "not_authenticated")
    assert_error(anonymous.post("/chats", json={}), 401, "not_authenticated")
    forged = closing(httpx.Client(base_url=stack.url, headers={"Authorization": "Bearer not.a.token"}))
    assert_error(forged.get("/chats"), 401, "invalid_token")


def test_parent_must_exist_and_fit(stack, api, prompt):
    chat_id, prompter_id = prompt
    missing = str(uuid.uuid4())
    assert_error(api.prompter(chat_id, "again", missing), 400, "parent_not_found")
    assert_error(api.prompter(chat_id, "second root"), 400, "parent_required")
    assert_error(api.prompter(chat_id, "answering myself", prompter_id), 400, "parent_not_assistant")
    assert_error(api.assistant(chat_id, missing, stack.model_name), 400, "parent_not_found")
    assert_error(api.client.get(f"/chats/{uuid.uuid4()}"), 404, "chat_not_found")


def test_empty_and_oversized_messages(stack, api):
    chat_id = api.create_chat()
    assert_error(api.prompter(chat_id, ""), 422, "validation_error")
    assert_error(api.prompter(chat_id, "   \n "), 422, "empty_message")
    assert_error(api.prompter(chat_id, "x" * 40_000), 422, "validation_error")
    bad_json = api.client.post(
        f"/chats/{chat_id}/prompter_message",
        content=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    assert_error(bad_json, 422, "validation_error")


@pytest.mark.parametrize(
    "sampling",
    [{"temperature": -1}, {"top_p": 2}, {"top_k": 0}, {"max_new_tokens": 0}, {"stop": [""]}, {"seed": -5}],
)
def test_invalid_sampling_parameters(stack, api, prompt, sampling):
    chat_id, prompter_id = prompt
    body = assert_error(
        api.assistant(chat_id, prompter_id, stack.model_name, **sampling), 422, "validation_error"
    )
    assert "sampling_parameters" in body["detail"]


def test_debug_login_validates_the_username(stack):
    assert_error(httpx.get(f"{stack.url}/auth/callback/debug", params={"code": ""}), 422, "validation_error")
    assert_error(
        httpx.get(f"{stack.url}/auth/callback/debug", params={"code": "a b"}), 422, "validation_error"
    )


def test_a_malformed_last_event_id_is_a_400(stack, api, prompt):
    chat_id, prompter_id = prompt
    message_id = api.assistant(chat_id, prompter_id, stack.model_name, max_new_tokens=2).json()["id"]
    response = api.client.get(
        f"/chats/{chat_id}/messages/{message_id}/events", headers={"Last-Event-ID": "not-an-id"}
    )
    assert_error(response, 400, "invalid_last_event_id")
