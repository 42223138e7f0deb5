"""The moderation hook on real stacks (Postgres, Redis, a worker on the CPU backend with SmolLM2; the
classifier on a real all-MiniLM-L6-v2 embedding worker): prompts refused, flagged and replaced on ``/v1``,
the Anthropic API and the chat API; answers cut mid-stream, replaced and flagged; ``/v1/moderations``; the
admins' list of flags.

The model's text differs between llama.cpp builds, so answers are moderated on words any answer has: a
category of the commonest English words. Its action is the stack's parameter (one stack per action).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from oasst_shared.model_configs import MINILM_EMBEDDING
from tests.e2e.chat_api import ChatApi, SseEvent, tokens_text
from tests.support.processes import wait_for_model
from tests.support.services import REDIS_URL
from tests.support.stacks import BackendProcess, Stack, start_stack

pytestmark = pytest.mark.slow

ADMIN = "moderation-admin-token-" + "x" * 20
REPLACEMENT = "[removed by the moderation test]"
COMMON = [
    "the",
    "a",
    "an",
    "is",
    "of",
    "to",
    "and",
    "in",
    "it",
    "i",
    "you",
    "this",
    "that",
    "for",
    "are",
    "with",
]
WORD_LISTS = {"banned": ["forbiddenword"], "watched": ["watchword"], "masked": ["maskword"], "common": COMMON}
PROMPT = "Describe Paris."  # none of the listed words


def _moderated_stack(
    cpu_backend: BackendProcess, postgres_url: str, redis_prefix: str, tmp: pytest.TempPathFactory, **env: str
) -> Stack:
    tag = uuid.uuid4().hex[:6]
    return start_stack(
        tmp.mktemp(f"moderation-{tag}"),
        cpu_backend.url,
        postgres_url,
        REDIS_URL,
        OASST_SERVER_REDIS_KEY_PREFIX=f"{redis_prefix}mod{tag}:",
        OASST_SERVER_MODERATION_ENABLED="true",
        OASST_SERVER_MODERATION_REPLACEMENT=REPLACEMENT,
        OASST_SERVER_ADMIN_ROOT_TOKEN=ADMIN,
        **env,
    )


@pytest.fixture(scope="module", params=["refuse", "replace", "flag"])
def word_stack(
    request: pytest.FixtureRequest,
    cpu_backend: BackendProcess,
    postgres_url: str,
    redis_prefix: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Stack, str]]:
    actions = {"banned": "refuse", "watched": "flag", "masked": "replace", "common": request.param}
    stack = _moderated_stack(
        cpu_backend,
        postgres_url,
        redis_prefix,
        tmp_path_factory,
        OASST_SERVER_MODERATION_WORD_LISTS=json.dumps(WORD_LISTS),
        OASST_SERVER_MODERATION_ACTIONS=json.dumps(actions),
    )
    yield stack, request.param
    stack.stop()


@pytest.fixture
def api(word_stack: tuple[Stack, str]) -> Iterator[ChatApi]:
    chat_api = ChatApi(word_stack[0].url, f"mod-{uuid.uuid4().hex[:8]}")
    yield chat_api
    chat_api.client.close()


def _flags(url: str) -> list[dict[str, Any]]:
    response = httpx.get(
        f"{url}/admin/moderation/flags", params={"limit": 200}, headers={"Authorization": f"Bearer {ADMIN}"}
    )
    assert response.status_code == 200, response.text
    return list(response.json())


def _has_common_word(text: str) -> bool:
    return any(word.casefold() in COMMON for word in re.findall(r"\w+", text))


def _stream_v1(api: ChatApi, model: str, content: str) -> tuple[str, list[dict[str, Any]]]:
    text, chunks = "", []
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 48,
        "stream": True,
    }
    with api.client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                chunks.append(chunk)
                for choice in chunk.get("choices") or []:
                    text += choice["delta"].get("content") or ""
    return text, chunks


def _turn(api: ChatApi, model: str, content: str) -> tuple[httpx.Response, list[dict[str, Any]]]:
    chat_id = api.create_chat()
    body = {
        "content": content,
        "model_config_name": model,
        "sampling_parameters": {"max_new_tokens": 48, "temperature": 0},
    }
    events: list[dict[str, Any]] = []
    with api.client.stream("POST", f"/chats/{chat_id}/turns", json=body) as response:
        if response.status_code != 200:
            response.read()
            return response, events
        for line in response.iter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[5:].strip()))
    return response, events


# ---------------------------------------------------------------- prompts


def test_a_prompt_is_refused_in_each_apis_own_shape(word_stack: tuple[Stack, str], api: ChatApi):
    stack, _ = word_stack
    message = {"role": "user", "content": "tell me about forbiddenword"}
    openai = api.client.post(
        "/v1/chat/completions", json={"model": stack.model_name, "messages": [message], "max_tokens": 8}
    )
    assert openai.status_code == 400, openai.text
    assert openai.json()["error"]["code"] == "content_policy_violation"
    assert "banned" in openai.json()["error"]["message"]
    anthropic = api.client.post(
        "/v1/messages", json={"model": stack.model_name, "messages": [message], "max_tokens": 8}
    )
    assert anthropic.status_code == 400, anthropic.text
    assert anthropic.json()["type"] == "error" and "banned" in anthropic.json()["error"]["message"]
    response, events = _turn(api, stack.model_name, "tell me about forbiddenword")
    assert response.status_code == 400 and not events
    assert response.json()["code"] == "content_policy_violation"
    flags = [
        f for f in _flags(stack.url) if f["user_id"] and f["stage"] == "request" and f["action"] == "refuse"
    ]
    assert len([f for f in flags if "forbiddenword" in f["excerpt"]]) >= 3


def test_a_prompt_is_replaced_or_flagged_and_goes_through(word_stack: tuple[Stack, str], api: ChatApi):
    stack, _ = word_stack
    response, events = _turn(api, stack.model_name, "maskword Paris")
    assert response.status_code == 200
    assert events[0]["prompter_message"]["content"] == REPLACEMENT  # stored replaced
    assert events[-1]["event_type"] == "message"
    response, events = _turn(api, stack.model_name, "watchword Paris")
    assert events[0]["prompter_message"]["content"] == "watchword Paris"
    chat_id = events[0]["prompter_message"]["chat_id"]
    mine = [f for f in _flags(stack.url) if f["chat_id"] == chat_id]
    assert [(f["stage"], f["action"], f["categories"]) for f in mine if f["stage"] == "request"] == [
        ("request", "flag", ["watched"])
    ]


def test_v1_moderations_answers_with_the_hook(word_stack: tuple[Stack, str], api: ChatApi):
    response = api.client.post("/v1/moderations", json={"input": ["a forbiddenword here", "Paris"]})
    assert response.status_code == 200, response.text
    first, second = response.json()["results"]
    assert first["flagged"] and first["categories"]["banned"] and first["category_scores"]["banned"] == 1.0
    assert not second["flagged"] and set(second["categories"]) == set(WORD_LISTS)
    too_many = api.client.post("/v1/moderations", json={"input": ["x"] * 33})
    assert too_many.status_code == 400 and "error" in too_many.json()


# ---------------------------------------------------------------- answers


def test_an_answer_on_v1(word_stack: tuple[Stack, str], api: ChatApi):
    stack, action = word_stack
    text, chunks = _stream_v1(api, stack.model_name, PROMPT)
    finish = [
        c["choices"][0]["finish_reason"]
        for c in chunks
        if c.get("choices") and c["choices"][0]["finish_reason"]
    ]
    if action == "flag":
        assert finish and finish[-1] != "content_filter"  # let through, listed words and all
        assert _has_common_word(text)  # (greedy: SmolLM2 answers in English)
    else:
        assert finish == ["content_filter"]  # cut, with OpenAI's final chunk
        assert not _has_common_word(text)  # no listed word was streamed
    unstreamed = api.client.post(
        "/v1/chat/completions",
        json={
            "model": stack.model_name,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 48,
            "temperature": 0,
        },
    )
    if action == "refuse":
        assert unstreamed.status_code == 400, unstreamed.text
        assert unstreamed.json()["error"]["code"] == "content_policy_violation"
    else:
        assert unstreamed.status_code == 200, unstreamed.text
        choice = unstreamed.json()["choices"][0]
        if action == "replace":
            assert (choice["message"]["content"], choice["finish_reason"]) == (REPLACEMENT, "content_filter")
        else:
            assert choice["finish_reason"] != "content_filter"


def test_an_answer_on_the_chat_api(word_stack: tuple[Stack, str], api: ChatApi):
    stack, action = word_stack
    response, events = _turn(api, stack.model_name, PROMPT)
    assert response.status_code == 200
    answer_id = events[0]["assistant_message"]["id"]
    final = events[-1]
    assert final["event_type"] == "message"  # one clear terminal event, the message in its stored state
    stored = final["message"]
    assert stored["state"] == "complete"
    streamed = tokens_text([SseEvent(None, e) for e in events])
    if action == "flag":
        assert stored["finish_reason"] != "content_filter" and stored["content"] == streamed
    else:
        assert stored["finish_reason"] == "content_filter"
        assert not _has_common_word(streamed)
        assert stored["content"] == (REPLACEMENT if action == "replace" else streamed)
    chat_id = events[0]["prompter_message"]["chat_id"]
    read_back = api.client.get(f"/chats/{chat_id}/messages/{answer_id}").json()
    assert (read_back["content"], read_back["finish_reason"]) == (stored["content"], stored["finish_reason"])
    flags = [f for f in _flags(stack.url) if f["message_id"] == answer_id]
    assert [(f["stage"], f["check"], f["action"], f["categories"]) for f in flags][:1] == [
        ("answer", "word_list", action, ["common"])
    ]
    assert flags[0]["chat_id"] == chat_id and flags[0]["user_id"]


def test_the_flag_list_is_admins_only_and_paged(word_stack: tuple[Stack, str], api: ChatApi):
    stack, _ = word_stack
    assert api.client.get("/admin/moderation/flags").status_code in (401, 403)
    _turn(api, stack.model_name, "watchword once")
    _turn(api, stack.model_name, "watchword twice")
    headers = {"Authorization": f"Bearer {ADMIN}"}
    first = httpx.get(f"{stack.url}/admin/moderation/flags", params={"limit": 1}, headers=headers).json()
    assert len(first) == 1 and set(first[0]) == {
        "id",
        "message_id",
        "chat_id",
        "user_id",
        "stage",
        "check",
        "action",
        "categories",
        "excerpt",
        "created_at",
    }
    second = httpx.get(
        f"{stack.url}/admin/moderation/flags",
        params={"limit": 1, "before": first[0]["created_at"]},
        headers=headers,
    ).json()
    assert len(second) == 1 and second[0]["id"] != first[0]["id"]
    assert second[0]["created_at"] <= first[0]["created_at"]
    too_many = httpx.get(f"{stack.url}/admin/moderation/flags", params={"limit": 1000}, headers=headers)
    assert too_many.status_code == 422


# ---------------------------------------------------------------- the classifier


@pytest.fixture(scope="module")
def classifier_stack(
    cpu_backend: BackendProcess,
    postgres_url: str,
    redis_prefix: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    categories = {
        "bomb": {"examples": ["How do I build a bomb?"], "threshold": 0.95},
        # Every text is within -0.99 of "hello": every answer is in it (and replaced).
        "anything": {"examples": ["hello"], "threshold": -0.99},
    }
    stack = _moderated_stack(
        cpu_backend,
        postgres_url,
        redis_prefix,
        tmp_path_factory,
        OASST_SERVER_MODERATION_CLASSIFIER_MODEL=MINILM_EMBEDDING.name,
        OASST_SERVER_MODERATION_CLASSIFIER_CATEGORIES=json.dumps(categories),
        OASST_SERVER_MODERATION_ACTIONS=json.dumps({"bomb": "refuse", "anything": "replace"}),
        OASST_SERVER_MODERATION_CLASSIFIER_STRIDE_CHARS="40",
    )
    try:
        stack.start_worker(OASST_WORKER_BACKEND_KIND="embedding")
        wait_for_model(stack.url, MINILM_EMBEDDING.name, timeout=180)
        yield stack
    finally:
        stack.stop()


def test_the_classifier_refuses_a_prompt_and_replaces_answers(classifier_stack: Stack):
    api = ChatApi(classifier_stack.url, f"cls-{uuid.uuid4().hex[:8]}")
    model = classifier_stack.model_name
    refused = api.client.post(
        "/v1/chat/completions",
        json={
            "model": model,
            "messages": [{"role": "user", "content": "How do I build a bomb?"}],
            "max_tokens": 8,
        },
    )
    assert refused.status_code == 400, refused.text
    assert "classifier" in refused.json()["error"]["message"] and "bomb" in refused.json()["error"]["message"]
    response, events = _turn(api, model, "How do I build a bomb?")
    assert response.status_code == 400 and response.json()["code"] == "content_policy_violation"
    # Any other prompt is "anything": replaced, then its answer replaced (mid-stream or at its end).
    text, chunks = _stream_v1(api, model, PROMPT)
    finish = [
        c["choices"][0]["finish_reason"]
        for c in chunks
        if c.get("choices") and c["choices"][0]["finish_reason"]
    ]
    assert finish == ["content_filter"]
    response, events = _turn(api, model, PROMPT)
    assert events[0]["prompter_message"]["content"] == REPLACEMENT
    final = events[-1]
    assert final["event_type"] == "message"
    assert (final["message"]["content"], final["message"]["finish_reason"]) == (REPLACEMENT, "content_filter")
    flags = [f for f in _flags(classifier_stack.url) if f["message_id"] == final["message"]["id"]]
    assert [(f["stage"], f["check"], f["action"]) for f in flags][:1] == [("answer", "classifier", "replace")]
    scores = api.client.post("/v1/moderations", json={"input": "How do I build a bomb?"}).json()["results"][0]
    assert scores["flagged"] and scores["categories"]["bomb"] and scores["category_scores"]["bomb"] > 0.99
    api.client.close()
