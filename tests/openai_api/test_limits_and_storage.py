"""Per-user limits (429 with Retry-After on /v1 and on the chat API), conversations stored as chats,
and a stream whose worker is lost after it sent text (continued, or, constrained, ended with an error).

On ``limited_stack``: 3 generations per minute, 1 at a time per user, API conversations kept as chats.
"""

from __future__ import annotations

import signal

import openai
import pytest

from tests.e2e.chat_api import ChatApi
from tests.openai_api.conftest import RATE_LIMIT, new_user
from tests.support.processes import wait_for_model
from tests.support.stacks import MODEL_NAME, Stack

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
LONG_TASK = [{"role": "user", "content": "Count from 1 to 1000, separated by commas."}]
STORY = [{"role": "user", "content": "Write a long story about a brave knight."}]
COUNTING = {
    "type": "object",
    "properties": {"numbers": {"type": "array", "items": {"type": "integer"}, "minItems": 300}},
    "required": ["numbers"],
}


def test_rate_limit_is_a_429_with_retry_after_on_both_apis(limited_stack: Stack) -> None:
    user = new_user(limited_stack)
    client = user.client(user.create_key()["key"])
    chat_api = ChatApi(limited_stack.url, user.name)
    chat_id = chat_api.create_chat()
    prompt = chat_api.prompter(chat_id, "Hello!").json()["id"]
    # Chat answers and API completions share the budget.
    answer = chat_api.assistant(chat_id, prompt, MODEL_NAME, do_sample=False, max_new_tokens=2)
    assert answer.status_code == 200
    chat_api.events(chat_id, answer.json()["id"])  # let it finish: one generation at a time
    for _ in range(RATE_LIMIT - 1):
        client.completions.create(model=MODEL_NAME, prompt="Hi", temperature=0, max_tokens=1)

    with pytest.raises(openai.RateLimitError) as caught:
        client.completions.create(model=MODEL_NAME, prompt="Hi", temperature=0, max_tokens=1)
    error = caught.value
    assert error.status_code == 429
    assert isinstance(error.body, dict) and error.body["type"] == "rate_limit_error"
    assert error.body["code"] == "rate_limited"
    assert 1 <= int(error.response.headers["Retry-After"]) <= 60

    refused = chat_api.assistant(chat_id, prompt, MODEL_NAME, do_sample=False, max_new_tokens=2)
    assert refused.status_code == 429
    assert refused.json()["code"] == "rate_limited" and refused.json()["detail"]
    assert 1 <= int(refused.headers["Retry-After"]) <= 60

    # Another user has their own budget.
    other = new_user(limited_stack)
    other.client().completions.create(model=MODEL_NAME, prompt="Hi", temperature=0, max_tokens=1)


def test_concurrent_generations_are_limited_per_user(limited_stack: Stack) -> None:
    user = new_user(limited_stack)
    client = user.client()
    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=LONG_TASK, temperature=0, max_tokens=300, stream=True
    )
    first = next(iter(stream))  # the generation is queued or running
    try:
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(model=MODEL_NAME, messages=QUESTION, max_tokens=2)
        assert caught.value.body["code"] == "too_many_concurrent_generations"  # type: ignore[index]
        assert int(caught.value.response.headers["Retry-After"]) >= 1
    finally:
        stream.close()
    # Closing the stream cancelled the first: the user may generate again.
    assert user.wait_finished(first.id.split("-", 1)[1])["state"] == "cancelled"
    client.chat.completions.create(model=MODEL_NAME, messages=QUESTION, temperature=0, max_tokens=2)


def test_background_responses_count_as_running_generations(limited_stack: Stack) -> None:
    # A background response runs with nobody reading it: it holds one of the user's concurrent
    # generations until it ends, so background runs are bounded per user as streams are.
    client = new_user(limited_stack).client()
    running = client.responses.create(
        model=MODEL_NAME, input=LONG_TASK[0]["content"], background=True, max_output_tokens=300, temperature=0
    )
    try:
        with pytest.raises(openai.RateLimitError) as caught:
            client.responses.create(model=MODEL_NAME, input="Hi", background=True, max_output_tokens=2)
        assert caught.value.body["code"] == "too_many_concurrent_generations"  # type: ignore[index]
    finally:
        cancelled = client.responses.cancel(running.id)
    assert cancelled.status == "cancelled"


def test_api_conversations_can_be_stored_as_chats(limited_stack: Stack) -> None:
    user = new_user(limited_stack)
    client = user.client(user.create_key()["key"])
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Hello Ada."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    completion = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, temperature=0, max_tokens=8
    )
    record = user.request_record(completion.id.split("-", 1)[1])
    assert record["chat_id"] is not None

    chats = user.http.get("/chats").json()["chats"]
    assert [c["id"] for c in chats] == [record["chat_id"]]
    assert chats[0]["title"] == "My name is Ada."
    chat = user.http.get(f"/chats/{record['chat_id']}").json()
    assert [(m["role"], m["content"]) for m in chat["messages"]] == [
        ("prompter", "My name is Ada."),
        ("assistant", "Hello Ada."),
        ("prompter", "What is the capital of France?"),
        ("assistant", completion.choices[0].message.content),
    ]
    answer = chat["messages"][-1]
    assert answer["state"] == "complete" and answer["generated_tokens"] == completion.usage.completion_tokens  # type: ignore[union-attr]
    assert chat["active_thread_tail_message_id"] == answer["id"]
    assert answer["parent_id"] == chat["messages"][2]["id"]


def test_a_stream_whose_worker_is_killed_halfway_goes_on_to_the_uninterrupted_answer(
    limited_stack: Stack,
) -> None:
    """Continuation: the next worker goes on from the text already sent; the stream has no gap, no
    repeat and no error, and its text and usage are those of the answer no kill interrupted."""
    user = new_user(limited_stack)
    client = user.client()
    reference = client.chat.completions.create(
        model=MODEL_NAME, messages=STORY, temperature=0, max_tokens=100
    )
    expected = reference.choices[0].message.content or ""
    assert reference.usage is not None and reference.usage.completion_tokens >= 60, reference
    stream = client.chat.completions.create(
        model=MODEL_NAME,
        messages=STORY,
        temperature=0,
        max_tokens=100,
        stream=True,
        stream_options={"include_usage": True},
    )
    worker = limited_stack.workers[-1]
    received = ""
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            received += chunk.choices[0].delta.content
            if worker.alive() and len(received) >= len(expected) // 2:
                worker.stop(signal.SIGKILL)  # about halfway
                limited_stack.start_worker()
    assert not worker.alive()
    assert received == expected
    assert usage is not None and usage.completion_tokens == reference.usage.completion_tokens
    wait_for_model(limited_stack.url, MODEL_NAME)


def test_a_constrained_stream_whose_worker_is_lost_after_sending_text_ends_with_an_error(
    limited_stack: Stack,
) -> None:
    """A JSON-schema answer cannot be continued (its grammar's state is lost): it would start over, and
    the text already sent cannot be taken back, so the stream ends with an error."""
    user = new_user(limited_stack)
    client = user.client()
    stream = client.chat.completions.create(
        model=MODEL_NAME,
        messages=LONG_TASK,
        temperature=0,
        max_tokens=400,
        stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "count", "schema": COUNTING}},
    )
    worker = limited_stack.workers[-1]
    received = ""
    with pytest.raises(openai.APIError) as caught:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                received += chunk.choices[0].delta.content
                if worker.alive():
                    worker.stop(signal.SIGKILL)  # the text already sent cannot be taken back
    assert received
    assert "worker" in caught.value.message and "retry" in caught.value.message
    # The regeneration nobody reads is cancelled, and the stack gets a worker again.
    request_id = chunk.id.split("-", 1)[1]
    assert user.wait_finished(request_id, timeout=30)["state"] == "cancelled"
    limited_stack.start_worker()
    wait_for_model(limited_stack.url, MODEL_NAME)
