"""A prompt too long for the model, on the real stack: server, workers and the CPU backend (SmolLM2, an
input limit of 1,536 tokens), counted with the model's own tokenizer before anything is queued.

* ``/v1``: 400 ``context_length_exceeded`` (the OpenAI SDK's ``BadRequestError``) with the prompt's
  tokens, as the CPU backend's tokenizer counts the prompt the worker would render, and the limit;
* the chat API: a message too long is cut from the left on the worker and answered (SmolLM2's config,
  ``chat_prompt_overflow: cut``), or refused at submission with the numbers (a model config that says
  ``refuse``, here a second worker in front of the same backend);
* with two replicas (Postgres, Redis), a replica with no worker of the model has a worker of the other
  count the prompt, through the broker.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest

from oasst_shared.chat_template import render
from oasst_shared.model_configs import SMOLLM2_135M
from oasst_shared.protocol import ChatTurn
from tests.e2e.chat_api import ChatApi
from tests.openai_api.conftest import new_user
from tests.support.processes import start_process, wait_for_model
from tests.support.services import fresh_database, fresh_redis_prefix
from tests.support.stacks import (
    MODEL_NAME,
    WORKER_API_KEY,
    BackendProcess,
    Stack,
    start_replicas,
    start_stack,
)

pytestmark = pytest.mark.slow

LIMIT = SMOLLM2_135M.max_input_length
REFUSING = "SmolLM2-refusing"
PARAGRAPH = (
    "The committee met on Tuesday to discuss the budget for the coming year, and after a long debate "
    "about the library, the bridge and the school, it agreed to postpone the decision until spring. "
)
LONG = (PARAGRAPH * 80)[:12_000]  # under the 16,000-character limit, some 2,400 tokens
FITS = (PARAGRAPH * 20)[:3_000]  # over the bytes bound (so it is counted), some 600 tokens


@pytest.fixture(scope="module")
def stack(cpu_backend: BackendProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The embedded stack (SQLite, in-process broker) with a second worker whose model refuses."""
    log_dir = tmp_path_factory.mktemp("prompt-length")
    stack = start_stack(log_dir, cpu_backend.url, f"sqlite+aiosqlite:///{log_dir}/oasst.db", None, workers=0)
    # A prompt of 1,536 tokens takes the shared backend a while to read on a busy machine: no stall.
    patient = {"OASST_WORKER_BACKEND_TOKEN_TIMEOUT": "180"}
    try:
        stack.start_worker(**patient)
        refusing = SMOLLM2_135M.model_copy(update={"name": REFUSING, "chat_prompt_overflow": "refuse"})
        stack.start_worker(OASST_WORKER_MODEL_CONFIG_JSON=refusing.model_dump_json(), **patient)
        wait_for_model(stack.url, MODEL_NAME)
        wait_for_model(stack.url, REFUSING)
        yield stack
    finally:
        stack.stop()


def backend_count(backend: str, text: str) -> int:
    """Tokens of ``text`` by the CPU backend's tokenizer (its /tokenize)."""
    response = httpx.post(f"{backend}/tokenize", json={"inputs": text}, timeout=30)
    response.raise_for_status()
    return len(response.json())


def rendered(backend: str, content: str, system_prompt: str | None = None) -> str:
    """The prompt the worker renders for a system prompt and one user message (the GGUF's template)."""
    info = httpx.get(f"{backend}/info", timeout=30).json()
    return render(
        info["chat_template"],
        [ChatTurn(role="user", content=content)],
        system_prompt=system_prompt,
        bos_token=info.get("bos_token") or "",
        eos_token=info.get("eos_token") or "",
    )


def test_v1_refuses_a_prompt_the_model_cannot_take_with_both_numbers(stack: Stack) -> None:
    client = new_user(stack).client()
    messages = [
        {"role": "system", "content": "Summarize."},
        {"role": "user", "content": "An earlier question"},
        {"role": "assistant", "content": "An earlier answer"},
        {"role": "user", "content": LONG},
    ]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=8)  # type: ignore[arg-type]
    error = refused.value.body
    assert (
        isinstance(error, dict)
        and error["code"] == "context_length_exceeded"
        and error["param"] == "messages"
    )
    tokens = backend_count(stack.backend_url, rendered(stack.backend_url, LONG, "Summarize."))
    assert tokens > LIMIT
    assert f"maximum input length is {LIMIT} tokens" in error["message"]
    assert f"resulted in {tokens} tokens" in error["message"]
    with pytest.raises(openai.BadRequestError) as streamed:  # refused before any chunk
        client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=8, stream=True)  # type: ignore[arg-type]
    assert streamed.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as raw:
        client.completions.create(model=MODEL_NAME, prompt=LONG, max_tokens=8)
    assert raw.value.body["param"] == "prompt"  # type: ignore[index]
    assert (
        f"your prompt resulted in {backend_count(stack.backend_url, LONG)} tokens"
        in raw.value.body["message"]
    )  # type: ignore[index]


def test_v1_answers_a_long_prompt_that_fits(stack: Stack) -> None:
    client = new_user(stack).client()
    answer = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": FITS}], max_tokens=4, temperature=0
    )
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == backend_count(stack.backend_url, rendered(stack.backend_url, FITS))


def test_the_chat_api_cuts_a_message_too_long_from_the_left_and_answers_it(stack: Stack) -> None:
    chat_api = ChatApi(stack.url, f"cut-{uuid.uuid4().hex[:8]}")
    chat_id = chat_api.create_chat()
    message_id, events = chat_api.ask(chat_id, LONG, MODEL_NAME, do_sample=False, max_new_tokens=4)
    final = events[-1].data
    assert final["event_type"] == "message", final
    message = final["message"]
    assert message["state"] == "complete" and message["generated_tokens"] >= 1
    assert LIMIT - 40 < message["prompt_tokens"] <= LIMIT  # cut to fit, and no more than that
    worker_logs = "".join(w.log_path.read_text(errors="replace") for w in stack.workers)
    cut = re.search(
        rf"message {message_id}: cut (\d+) characters from the start of the newest turn", worker_logs
    )
    assert cut is not None and 0 < int(cut.group(1)) < len(LONG)


def test_the_chat_api_refuses_at_submission_when_the_model_config_says_so(stack: Stack) -> None:
    chat_api = ChatApi(stack.url, f"refuse-{uuid.uuid4().hex[:8]}")
    chat_id = chat_api.create_chat()
    turn = chat_api.client.post(
        f"/chats/{chat_id}/turns", json={"content": LONG, "model_config_name": REFUSING}
    )
    assert turn.status_code == 400, turn.text
    assert turn.json()["code"] == "context_length_exceeded"
    tokens = backend_count(stack.backend_url, rendered(stack.backend_url, LONG))
    assert f"need {tokens} tokens" in turn.json()["detail"] and f"takes {LIMIT}" in turn.json()["detail"]
    assert chat_api.client.get(f"/chats/{chat_id}").json()["messages"] == []  # both messages or neither
    # The same message for the model that cuts is accepted (its stream is not read here).
    with chat_api.client.stream(
        "POST",
        f"/chats/{chat_id}/turns",
        json={"content": LONG, "model_config_name": MODEL_NAME, "sampling_parameters": {"max_new_tokens": 1}},
    ) as accepted:
        assert accepted.status_code == 200


@pytest.mark.postgres
@pytest.mark.redis
def test_a_replica_without_a_worker_has_one_of_another_replica_count(
    cpu_backend: BackendProcess, tmp_path_factory: pytest.TempPathFactory
) -> None:
    log_dir = tmp_path_factory.mktemp("prompt-length-replicas")
    with fresh_database("oasst_prompt_replicas") as database, fresh_redis_prefix("prompt-replicas") as prefix:
        started = start_replicas(log_dir, database, prefix, ("counting", "asking"))
        processes = [process for _, process in started]
        try:
            (counting, _), (asking, _) = started
            processes.append(
                start_process(
                    "worker",
                    "oasst_worker",
                    {
                        "OASST_WORKER_SERVER_URL": counting.replace("http://", "ws://", 1),
                        "OASST_WORKER_API_KEY": WORKER_API_KEY,
                        "OASST_WORKER_BACKEND_URL": cpu_backend.url,
                    },
                    log_dir,
                )
            )
            wait_for_model(asking, MODEL_NAME, timeout=90)
            tokens = backend_count(cpu_backend.url, rendered(cpu_backend.url, LONG))
            for url in (asking, counting):  # the asking replica first: nothing is remembered yet
                stack = Stack(url, MODEL_NAME, processes[0], [], log_dir, {}, cpu_backend.url)
                with pytest.raises(openai.BadRequestError) as refused:
                    new_user(stack).client().chat.completions.create(
                        model=MODEL_NAME, messages=[{"role": "user", "content": LONG}], max_tokens=8
                    )
                assert refused.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
                assert f"resulted in {tokens} tokens" in refused.value.body["message"]  # type: ignore[index]
        finally:
            for process in processes:
                process.stop()
