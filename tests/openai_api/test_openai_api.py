"""The OpenAI-compatible API driven by the official ``openai`` SDK, against the real stacks.

Each test runs on the embedded default (SQLite, in-process broker) and on Postgres + Redis, with the
real CPU backend serving SmolLM2. Greedy output differs between llama.cpp builds, so the tests check
properties (token counts, finish reasons, equality within a run), not fixed text.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid

import asyncpg
import httpx
import openai
import pytest

from tests.openai_api.conftest import ApiUser, new_user

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
COUNTING = ", ".join(str(n) for n in range(1, 21)) + ","


def _request_id(completion_id: str) -> str:
    return completion_id.split("-", 1)[1]


# ---------------------------------------------------------------- models


def test_models_lists_the_live_model_with_its_context_length(client: openai.OpenAI) -> None:
    models = {m.id: m for m in client.models.list().data}
    assert MODEL in models
    card = models[MODEL]
    assert card.object == "model" and card.owned_by == "oasst"
    assert card.model_extra is not None and card.model_extra["context_length"] == 2048
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


# ---------------------------------------------------------------- chat completions


def test_chat_completion(client: openai.OpenAI, user: ApiUser) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "You answer briefly."}, *QUESTION],
        temperature=0,
        max_tokens=12,
    )
    assert completion.object == "chat.completion" and completion.model == MODEL
    choice = completion.choices[0]
    assert len(completion.choices) == 1 and choice.index == 0
    assert choice.message.role == "assistant" and choice.message.content and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    usage = completion.usage
    assert usage is not None
    assert 1 <= usage.completion_tokens <= 12 and usage.prompt_tokens > 5
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    if choice.finish_reason == "length":
        assert usage.completion_tokens == 12
    # The usage matches what the worker reported for the message.
    record = user.request_record(_request_id(completion.id))
    assert record["state"] == "complete" and record["kind"] == "completion"
    assert record["completion_tokens"] == usage.completion_tokens
    assert record["prompt_tokens"] == usage.prompt_tokens


def test_streamed_chat_completion_matches_the_unstreamed_one(client: openai.OpenAI, user: ApiUser) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=16)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        temperature=0,
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    with_choices = [c for c in chunks if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in with_choices)
    finish = [c.choices[0].finish_reason for c in with_choices if c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    assert with_choices[-1].choices[0].finish_reason == finish[0]
    # Greedy decoding repeats within one build: the stream spells the same answer.
    assert text == whole.choices[0].message.content and text.strip()
    # include_usage: one last chunk with the usage and no choices.
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    assert last.usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]
    record = user.request_record(_request_id(last.id))
    assert record["completion_tokens"] == last.usage.completion_tokens and record["state"] == "complete"


def test_a_prompt_the_backend_has_cached_reports_its_cached_tokens(client: openai.OpenAI) -> None:
    """``usage.prompt_tokens_details.cached_tokens``: the prompt tokens the backend's prefix cache served
    (the bundled backend reuses whole 64-token chunks), unstreamed and streamed."""
    long_question = [
        {
            "role": "user",
            # A prompt of this test's own, from its start: no other request cached a chunk of it.
            "content": uuid.uuid4().hex
            + " Here is a long question about the history of the bicycle, its inventors, its wheels, "
            "its brakes, its gears and its use in cities around the world today." * 2,
        }
    ]
    first = client.chat.completions.create(model=MODEL, messages=long_question, temperature=0, max_tokens=2)
    assert first.usage is not None and first.usage.prompt_tokens > 64
    assert first.usage.prompt_tokens_details is not None
    cold = first.usage.prompt_tokens_details.cached_tokens or 0
    again = client.chat.completions.create(model=MODEL, messages=long_question, temperature=0, max_tokens=2)
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    cached = again.usage.prompt_tokens_details.cached_tokens or 0
    assert cold < 64 <= cached < again.usage.prompt_tokens
    stream = client.chat.completions.create(
        model=MODEL,
        messages=long_question,
        temperature=0,
        max_tokens=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = [chunk.usage for chunk in stream if chunk.usage is not None][-1]
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens == cached


def test_a_conversation_with_earlier_turns(client: openai.OpenAI) -> None:
    short = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=4)
    longer = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "user", "content": "My name is Ada."},
            {"role": "assistant", "content": "Nice to meet you, Ada."},
            # Content parts of type text are accepted too.
            {"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]},
        ],
        temperature=0,
        max_tokens=4,
    )
    assert longer.usage.prompt_tokens > short.usage.prompt_tokens  # type: ignore[union-attr]


def test_stop_sequences_and_seeded_sampling(client: openai.OpenAI) -> None:
    seeded = [
        client.chat.completions.create(
            model=MODEL, messages=QUESTION, temperature=0.9, top_p=0.9, seed=1234, max_tokens=10
        )
        for _ in range(2)
    ]
    assert seeded[0].choices[0].message.content == seeded[1].choices[0].message.content
    baseline = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=16)
    text = baseline.choices[0].message.content or ""
    words = text.split()
    assert len(words) >= 3, text  # greedy, 16 tokens: deterministic and long enough
    # Stop on the third word: the answer ends before it.
    stopped = client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=16, stop=[words[2]]
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert words[2] not in (stopped.choices[0].message.content or "")


# ---------------------------------------------------------------- completions


def test_completion(client: openai.OpenAI) -> None:
    completion = client.completions.create(
        model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=6
    )
    assert completion.object == "text_completion"
    choice = completion.choices[0]
    assert choice.text.strip() and choice.finish_reason in ("stop", "length")
    assert completion.usage is not None and 1 <= completion.usage.completion_tokens <= 6
    if choice.finish_reason == "length":
        assert completion.usage.completion_tokens == 6

    stream = client.completions.create(
        model=MODEL,
        prompt="The capital of France is",
        temperature=0,
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == choice.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        choice.finish_reason
    ]
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == completion.usage.completion_tokens


# ---------------------------------------------------------------- errors, as the SDK's own classes


def test_bad_keys_are_authentication_errors(stack, user: ApiUser) -> None:
    for bad in ("oak-not-a-real-key", "not-even-a-key"):
        with pytest.raises(openai.AuthenticationError) as caught:
            user.client(bad).models.list()
        assert caught.value.status_code == 401
    # Without any Authorization header: 401 in OpenAI's shape.
    response = httpx.get(f"{stack.url}/v1/models")
    assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"


def test_unknown_model_is_not_found_and_names_the_models(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-17", messages=QUESTION, max_tokens=4)
    assert caught.value.status_code == 404
    assert MODEL in caught.value.message
    assert isinstance(caught.value.body, dict) and caught.value.body["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-17", prompt="hi", max_tokens=4)


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"n": 9}, "n"),
        ({"temperature": -1}, "temperature"),
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"presence_penalty": 1.0}, "presence_penalty"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        (
            {"tools": [{"type": "function", "function": {"name": "f g", "parameters": {"type": "object"}}}]},
            "tools",
        ),
    ],
)
def test_bad_parameters_are_bad_request_errors(client: openai.OpenAI, options: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=QUESTION, **options)
    assert caught.value.status_code == 400
    body = caught.value.body
    # The param may name the exact place, as OpenAI does ("tools[0].function.name").
    assert (
        isinstance(body, dict) and body["param"].startswith(param) and body["type"] == "invalid_request_error"
    )
    assert body["message"]


def test_bad_messages_and_prompts_are_bad_request_errors(client: openai.OpenAI) -> None:
    bad_messages = [
        [],
        [{"role": "system", "content": "only a system prompt"}],
        [{"role": "tool", "content": "42", "tool_call_id": "x"}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}],
    ]
    for messages in bad_messages:
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)  # type: ignore[arg-type]
    for prompt in ([1, 2, 3], ["a", "b"], ""):
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model=MODEL, prompt=prompt, max_tokens=4)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="hi", echo=True, max_tokens=4)
    assert caught.value.body["param"] == "echo"  # type: ignore[index]
    # A generation model is not an embedding model.
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=MODEL, input="hello")
    assert caught.value.body["param"] == "model"  # type: ignore[index]


def test_unknown_fields_are_ignored(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        temperature=0,
        max_tokens=2,
        user="someone",
        extra_body={"some_future_option": {"x": 1}, "metadata": {"a": "b"}},
    )
    assert completion.usage is not None and completion.usage.completion_tokens >= 1


# ---------------------------------------------------------------- cancelling by closing the stream


def test_closing_a_stream_cancels_the_generation_and_counts_its_usage(
    stack, client: openai.OpenAI, user: ApiUser
) -> None:
    # The cancel comes once the resume grace (10 s) has passed: the answer must be longer than that, so it
    # is a raw count (a chat answer may end early), which goes on to max_tokens.
    stream = client.completions.create(
        model=MODEL, prompt=COUNTING, temperature=0, max_tokens=1800, stream=True
    )
    received = 0
    completion_id = ""
    for chunk in stream:
        completion_id = chunk.id
        if chunk.choices and chunk.choices[0].text:
            received += 1
        if received == 3:
            break
    stream.close()
    request_id = _request_id(completion_id)
    record = user.wait_finished(request_id, timeout=60)
    # The worker stopped early and reported what it had generated.
    assert record["state"] == "cancelled" and record["finish_reason"] == "cancelled"
    assert 3 <= record["completion_tokens"] < 1800
    assert record["prompt_tokens"] > 5
    usage = user.usage()
    assert usage["total"]["completion_tokens"] >= record["completion_tokens"]
    assert usage["api_keys"][0]["requests"] == 1
    assert usage["api_keys"][0]["completion_tokens"] == record["completion_tokens"]
    _assert_scrubbed(stack, request_id)


def _stored_message(stack, request_id: str) -> tuple[object, object, object]:
    """(content, request_payload, generated_tokens) of a message, read from the stack's database."""
    url = stack.server_env["OASST_SERVER_DATABASE_URL"]
    query = "SELECT content, request_payload, generated_tokens FROM message WHERE id = "
    if url.startswith("sqlite"):
        with sqlite3.connect(url.split("///", 1)[1]) as db:
            return db.execute(query + "?", (request_id,)).fetchone()  # type: ignore[no-any-return]

    async def read() -> tuple[object, object, object]:
        conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://", 1))
        try:
            row = await conn.fetchrow(query + "$1", request_id)
        finally:
            await conn.close()
        return row["content"], row["request_payload"], row["generated_tokens"]

    return asyncio.run(read())


def _assert_scrubbed(stack, request_id: str, timeout: float = 15) -> None:
    """By default nothing but the token counts of an answered API request stays in the database."""
    deadline = time.monotonic() + timeout
    while True:
        content, payload, tokens = _stored_message(stack, request_id)
        if (content is None and payload is None) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert content is None and payload is None and tokens is not None


def test_answered_requests_keep_only_their_usage(stack, client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=4)
    _assert_scrubbed(stack, _request_id(completion.id), timeout=0)


# ---------------------------------------------------------------- API keys and usage


def test_api_key_lifecycle_and_usage_per_key(stack, user: ApiUser) -> None:
    first, second = user.create_key("laptop"), user.create_key("server")
    for created in (first, second):
        assert created["key"].startswith("oak-") and created["key"].startswith(created["prefix"])
        assert len(created["key"]) > 40
    listed = user.http.get("/api_keys").json()["api_keys"]
    assert {k["id"] for k in listed} == {first["id"], second["id"]}
    assert all("key" not in k for k in listed)  # shown once, never again

    answer = user.client(first["key"]).completions.create(
        model=MODEL, prompt="Hello", temperature=0, max_tokens=3
    )
    for _ in range(2):
        user.client(second["key"]).completions.create(model=MODEL, prompt="Hi", temperature=0, max_tokens=2)
    # The user's access token works on /v1 too; its requests are not attributed to a key.
    user.client().completions.create(model=MODEL, prompt="Hey", temperature=0, max_tokens=2)

    usage = user.usage()
    per_key = {k["api_key_id"]: k for k in usage["api_keys"]}
    assert per_key[first["id"]]["requests"] == 1
    assert per_key[first["id"]]["completion_tokens"] == answer.usage.completion_tokens  # type: ignore[union-attr]
    assert per_key[first["id"]]["prompt_tokens"] == answer.usage.prompt_tokens  # type: ignore[union-attr]
    assert per_key[second["id"]]["requests"] == 2
    assert usage["without_api_key"]["requests"] == 1
    assert usage["total"]["requests"] == 4
    assert usage["total"]["total_tokens"] == sum(
        k["total_tokens"] for k in [*per_key.values(), usage["without_api_key"]]
    )
    listed_requests = user.http.get("/usage/requests", params={"api_key_id": second["id"]}).json()["requests"]
    assert len(listed_requests) == 2 and all(r["api_key_id"] == second["id"] for r in listed_requests)

    # Another user sees none of it.
    other = new_user(stack)
    assert other.http.delete(f"/api_keys/{first['id']}").status_code == 404
    assert other.http.get(f"/usage/requests/{_request_id(answer.id)}").status_code == 404
    assert other.usage()["total"]["requests"] == 0
    # Anonymous callers are refused.
    assert httpx.get(f"{stack.url}/api_keys").status_code == 401
    assert httpx.post(f"{stack.url}/api_keys", json={"name": "x"}).status_code == 401
    assert httpx.delete(f"{stack.url}/api_keys/{first['id']}").status_code == 401
    assert httpx.get(f"{stack.url}/usage").status_code == 401
    # A key cannot manage keys.
    with_key = httpx.get(f"{stack.url}/api_keys", headers={"Authorization": f"Bearer {first['key']}"})
    assert with_key.status_code == 401

    # Revoked: refused at once, still listed, usage still attributed.
    assert user.http.delete(f"/api_keys/{first['id']}").status_code == 204
    with pytest.raises(openai.AuthenticationError):
        user.client(first["key"]).models.list()
    revoked = [k for k in user.http.get("/api_keys").json()["api_keys"] if k["id"] == first["id"]]
    assert revoked[0]["revoked_at"] is not None and revoked[0]["last_used_at"] is not None
    after = {k["api_key_id"]: k for k in user.usage()["api_keys"]}
    assert after[first["id"]]["revoked"] and after[first["id"]]["requests"] == 1
    assert user.http.delete(f"/api_keys/{first['id']}").status_code == 204  # idempotent
    assert user.http.delete("/api_keys/no-such-key").status_code == 404
    assert user.http.post("/api_keys", json={"name": ""}).status_code == 422
