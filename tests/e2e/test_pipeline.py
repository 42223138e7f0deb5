"""The core pipeline end to end: server + worker + the real CPU backend with SmolLM2.

Each test runs twice: on the embedded default (SQLite, in-process broker) and on Postgres + Redis.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.e2e.chat_api import ChatApi, tokens_text
from tests.support.fault_flows import queue

pytestmark = pytest.mark.slow

GREEDY = {"do_sample": False, "max_new_tokens": 24}


@pytest.fixture(params=["embedded", "production"])
def stack(request):
    return request.getfixturevalue(f"{request.param}_stack")


@pytest.fixture
def api(stack) -> ChatApi:
    return ChatApi(stack.url, f"user-{uuid.uuid4().hex[:8]}")


def test_a_chat_message_streams_a_real_answer(stack, api):
    chat_id = api.create_chat()
    message_id, events = api.ask(chat_id, "What is the capital of France?", stack.model_name, **GREEDY)
    kinds = [e.data["event_type"] for e in events]
    assert kinds.count("token") >= 1
    assert kinds[-1] == "message" and kinds.count("message") == 1 and "error" not in kinds
    final = events[-1].data["message"]
    assert final["id"] == message_id and final["state"] == "complete"
    assert final["content"] == tokens_text(events) and final["content"].strip()
    assert final["finish_reason"] in ("eos_token", "length", "stop_sequence")
    assert 1 <= final["generated_tokens"] <= GREEDY["max_new_tokens"]
    assert final["prompt_tokens"] > 5
    # Stored events have strictly increasing ids.
    ids = [e.id for e in events if e.id]
    assert len(ids) == len(set(ids)) == kinds.count("token") + 1

    # The stored message and chat agree with the stream.
    stored = api.client.get(f"/chats/{chat_id}/messages/{message_id}").json()
    assert stored["content"] == final["content"] and stored["state"] == "complete"
    chat = api.client.get(f"/chats/{chat_id}").json()
    assert [m["role"] for m in chat["messages"]] == ["prompter", "assistant"]
    assert chat["title"] == "What is the capital of France?"


def test_a_follow_up_turn_sees_the_conversation(stack, api):
    chat_id = api.create_chat()
    first_id, first = api.ask(chat_id, "My name is Ada.", stack.model_name, **GREEDY)
    assert first[-1].data["event_type"] == "message"
    second_id, second = api.ask(chat_id, "What is my name?", stack.model_name, parent_id=first_id, **GREEDY)
    final = second[-1].data["message"]
    assert final["state"] == "complete" and final["parent_id"] != first_id
    # The second prompt contains the first exchange, so it is longer than the first prompt.
    assert final["prompt_tokens"] > first[-1].data["message"]["prompt_tokens"]


def test_max_new_tokens_gives_finish_reason_length(stack, api):
    chat_id = api.create_chat()
    _, events = api.ask(
        chat_id, "Write a long story about a dragon.", stack.model_name, do_sample=False, max_new_tokens=5
    )
    final = events[-1].data["message"]
    assert final["finish_reason"] == "length" and final["generated_tokens"] == 5


def test_greedy_answers_repeat_within_a_run(stack, api):
    answers = []
    for _ in range(2):
        chat_id = api.create_chat()
        _, events = api.ask(chat_id, "Name three colors.", stack.model_name, **GREEDY)
        answers.append(events[-1].data["message"]["content"])
    assert answers[0] == answers[1] and answers[0]


def test_sampling_with_seed_repeats(stack, api):
    params = {"temperature": 0.9, "top_p": 0.9, "top_k": 40, "seed": 1234, "max_new_tokens": 16}
    answers = []
    for _ in range(2):
        chat_id = api.create_chat()
        _, events = api.ask(chat_id, "Tell me a fun fact.", stack.model_name, **params)
        answers.append(events[-1].data["message"]["content"])
    assert answers[0] == answers[1]


def test_resume_with_last_event_id_has_no_duplicates_or_gaps(stack, api):
    chat_id = api.create_chat()
    message_id, events = api.ask(chat_id, "Count from one to ten.", stack.model_name, **GREEDY)
    stored = [e for e in events if e.id]
    assert len(stored) >= 3
    middle = stored[len(stored) // 2]
    rest = api.events(chat_id, message_id, last_event_id=middle.id)
    assert [e.id for e in rest] == [e.id for e in stored[len(stored) // 2 + 1 :]]
    # A finished message's stream replays its final event at once, and a second reader gets everything.
    again = api.events(chat_id, message_id)
    assert [e.data for e in again if e.id] == [e.data for e in stored]


def test_readers_of_one_answer_at_once_each_get_every_event_once(stack, api):
    """Readers of one message share the server's one read of its stream (streams/fanout.py): each still
    gets every event once and in order, one of them resuming with Last-Event-ID halfway."""
    chat_id, message_id = queue(
        api, stack.model_name, "Write a short poem about the sea.", do_sample=False, max_new_tokens=64
    )

    def read_all() -> list:
        return ChatApi(stack.url, api.username).events(chat_id, message_id)

    def resume_halfway() -> list:
        reader = ChatApi(stack.url, api.username)
        first = reader.events(chat_id, message_id, limit=8)
        stored = [e for e in first if e.id]
        return stored + reader.events(chat_id, message_id, last_event_id=stored[-1].id)

    with ThreadPoolExecutor(4) as pool:
        results = [
            future.result()
            for future in [pool.submit(read_all) for _ in range(3)] + [pool.submit(resume_halfway)]
        ]
    ids = [[e.id for e in events if e.id] for events in results]
    assert len(ids[0]) >= 3 and results[0][-1].data["event_type"] == "message"
    assert all(each == ids[0] for each in ids), ids
    assert all(tokens_text(events) == tokens_text(results[0]) for events in results)


def test_model_configs_lists_the_served_model(stack, api):
    configs = api.client.get("/configs/model_configs").json()
    smol = next(c for c in configs if c["name"] == stack.model_name)
    assert smol["worker_count"] >= 1 and smol["max_total_length"] > smol["max_input_length"]
