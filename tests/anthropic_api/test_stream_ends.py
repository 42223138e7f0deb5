"""How an Anthropic stream ends when it does not finish: the client closes it (the generation is cancelled
on its worker); and how it does not end when its worker is lost after text was sent (continued)."""

from __future__ import annotations

import signal
import uuid
from typing import Any

import anthropic
import pytest

from tests.anthropic_api.conftest import anthropic_client
from tests.openai_api.conftest import ApiUser
from tests.support.processes import wait_for_model
from tests.support.stacks import Stack

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
LONG_TASK: list[Any] = [{"role": "user", "content": "Count from 1 to 1000, separated by commas."}]
STORY: list[Any] = [{"role": "user", "content": "Write a long story about a brave knight."}]


def _client(stack: Stack) -> tuple[ApiUser, anthropic.Anthropic]:
    user = ApiUser(stack.url, f"ant-{uuid.uuid4().hex[:10]}")
    return user, anthropic_client(user, str(user.create_key()["key"]))


def test_closing_a_stream_cancels_its_generation(limited_stack: Stack) -> None:
    user, client = _client(limited_stack)
    stream = client.messages.create(
        model=MODEL, max_tokens=300, messages=LONG_TASK, stream=True, extra_body={"temperature": 0}
    )
    events = iter(stream)
    start = next(events)
    assert start.type == "message_start"
    message_id = start.message.id
    try:
        # One generation at a time on this stack: the running one refuses another.
        with pytest.raises(anthropic.RateLimitError) as limited:
            client.messages.create(model=MODEL, max_tokens=2, messages=LONG_TASK)
        assert limited.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    finally:
        stream.close()
    assert user.wait_finished(message_id)["state"] == "cancelled"
    assert client.messages.create(model=MODEL, max_tokens=2, messages=LONG_TASK).usage.output_tokens > 0


def test_a_stream_whose_worker_is_killed_halfway_goes_on_to_the_uninterrupted_answer(
    limited_stack: Stack,
) -> None:
    """Continuation: the next worker goes on from the text already sent; the SDK sees one unbroken
    answer, the one no kill interrupted, with its usage."""
    user, client = _client(limited_stack)
    reference = client.messages.create(
        model=MODEL, max_tokens=100, messages=STORY, extra_body={"temperature": 0}
    )
    expected = "".join(block.text for block in reference.content if block.type == "text")
    assert reference.usage.output_tokens >= 60, reference
    worker = limited_stack.workers[-1]
    received = ""
    with client.messages.stream(
        model=MODEL, max_tokens=100, messages=STORY, extra_body={"temperature": 0}
    ) as stream:
        for event in stream:
            if event.type == "text":
                received += event.text
                if worker.alive() and len(received) >= len(expected) // 2:
                    worker.stop(signal.SIGKILL)  # about halfway
                    limited_stack.start_worker()
        final = stream.get_final_message()
    assert not worker.alive()
    assert received == expected
    assert final.usage.output_tokens == reference.usage.output_tokens
    assert final.stop_reason == reference.stop_reason
    wait_for_model(limited_stack.url, MODEL)
