"""Resumable ``/v1`` streams on the real model: every chunk has an SSE id, and a client cut off mid-answer
gets the rest from ``GET /v1/chat/completions/{id}/stream`` with ``Last-Event-ID``, with no gap and no
duplicate. The official SDK reads the streams with their ids unchanged."""

from __future__ import annotations

import json

import pytest

from tests.openai_api.conftest import ApiUser, new_user
from tests.support.resumable_streams import cut_chat_stream, cutting_proxy, read_events, resume, text_of
from tests.support.stacks import MODEL_NAME, Stack

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "Name three colours of the rainbow and say why they appear."}]
GREEDY = {"model": MODEL_NAME, "messages": QUESTION, "temperature": 0, "max_tokens": 40}


def test_a_cut_chat_stream_resumes_with_no_gap_and_no_duplicate(
    stack: Stack, user: ApiUser, key: str
) -> None:
    # The uninterrupted greedy answer, streamed with the SDK (which reads chunks that carry ids).
    whole = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in user.client(key).chat.completions.create(stream=True, **GREEDY)
        if chunk.choices
    )
    assert whole

    with cutting_proxy(stack.url, events=5) as (proxy, proxy_url):
        client = user.client(key)
        client.base_url = f"{proxy_url}/v1"
        cut = cut_chat_stream(proxy, client, **GREEDY)
    assert cut.completion_id.startswith("chatcmpl-")
    assert cut.last_event_id.startswith(f"{cut.completion_id}/")
    assert whole.startswith(cut.text) and cut.text != whole  # cut mid-answer

    response = resume(stack.url, key, "chat/completions", cut.completion_id, cut.last_event_id)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = read_events(response)
    assert events[-1].data == "[DONE]"
    assert cut.text + text_of(events) == whole
    ids = [e.id for e in events]
    assert all(ids) and len(set(ids)) == len(ids)
    assert cut.last_event_id not in ids and ids[0] not in proxy.relayed_ids
    finish = json.loads(events[-2].data)["choices"][0]["finish_reason"]
    assert finish in ("stop", "length")

    # Without Last-Event-ID: the whole stream again, with the same ids as the first time.
    again = read_events(resume(stack.url, key, "chat/completions", cut.completion_id, None))
    assert text_of(again) == whole
    assert [e.id for e in again][: len(proxy.relayed_ids)] == proxy.relayed_ids


def test_a_completion_stream_has_ids_and_resumes(stack: Stack, user: ApiUser, key: str) -> None:
    stream = user.client(key).completions.create(
        model=MODEL_NAME, prompt="The capital of France is", temperature=0, max_tokens=12, stream=True
    )
    chunks = list(stream)
    whole = "".join(c.choices[0].text for c in chunks if c.choices)
    completion_id = chunks[0].id
    assert completion_id.startswith("cmpl-")
    events = read_events(resume(stack.url, key, "completions", completion_id, None))
    assert text_of(events, chat=False) == whole
    # Resuming after the second chunk gives the rest.
    rest = read_events(resume(stack.url, key, "completions", completion_id, events[1].id))
    assert text_of(events[:2], chat=False) + text_of(rest, chat=False) == whole
    # A completion id on the chat path is refused.
    wrong = resume(stack.url, key, "chat/completions", completion_id, None)
    assert wrong.status_code == 400 and wrong.json()["error"]["code"] == "invalid_completion_id"


def test_only_the_owner_resumes_and_bad_ids_are_refused(stack: Stack, user: ApiUser, key: str) -> None:
    chunks = list(user.client(key).chat.completions.create(stream=True, **{**GREEDY, "max_tokens": 4}))
    completion_id = chunks[0].id
    assert resume(stack.url, key, "chat/completions", completion_id, None).status_code == 200

    other: ApiUser = new_user(stack)
    other_key = str(other.create_key()["key"])
    foreign = resume(stack.url, other_key, "chat/completions", completion_id, None)
    assert foreign.status_code == 404 and foreign.json()["error"]["code"] == "completion_not_found"

    unknown = resume(stack.url, key, "chat/completions", "chatcmpl-0123456789abcdef", None)
    assert unknown.status_code == 404
    for bad_id in ("chatcmpl-../../x", "cmpl-abc", "x" * 300):
        refused = resume(stack.url, key, "chat/completions", bad_id, None)
        assert refused.status_code in (400, 404), refused.text
        assert "error" in refused.json()
    for bad_last in ("chatcmpl-0/5-0", f"{completion_id}/$", f"{completion_id}/1-0.x", "y" * 500):
        refused = resume(stack.url, key, "chat/completions", completion_id, bad_last)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["code"] == "invalid_last_event_id"
    anonymous = resume(stack.url, "not-a-key", "chat/completions", completion_id, None)
    assert anonymous.status_code == 401
