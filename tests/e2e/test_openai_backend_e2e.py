"""Workers with the ``openai`` adapter in front of a real third-party OpenAI-compatible server
(llama-cpp-python's ``python -m llama_cpp.server`` on the SmolLM2 file), end to end through the broker:
chat API -> server -> worker -> /v1/completions (or /v1/chat/completions) -> tokens back to the client.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.e2e.chat_api import ChatApi, tokens_text
from tests.support.llama_server import ALIAS, LlamaServer, OpenAiWorker, stack_on_llama_server
from tests.support.stacks import Stack

pytestmark = pytest.mark.slow

GREEDY = {"do_sample": False, "max_new_tokens": 24}


@dataclass
class Deployment:
    stack: Stack
    llama: LlamaServer
    completions_model: str
    chat_model: str


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    suffix = uuid.uuid4().hex[:6]
    completions_model, chat_model = f"smollm2-openai-{suffix}", f"smollm2-openai-chat-{suffix}"
    workers = [
        OpenAiWorker(completions_model, env={"OASST_WORKER_BACKEND_MODEL": ALIAS}),
        # Configured the other way: the server's root URL (no /v1), the model named by the config's model_id.
        OpenAiWorker(chat_model, path="", env={"OASST_WORKER_OPENAI_MODE": "chat"}),
    ]
    with stack_on_llama_server(tmp_path_factory.mktemp("openai-backend-e2e"), workers) as (stack, llama):
        yield Deployment(stack, llama, completions_model, chat_model)


@pytest.fixture
def api(deployment: Deployment) -> ChatApi:
    return ChatApi(deployment.stack.url, f"user-{uuid.uuid4().hex[:8]}")


def test_a_chat_answer_streams_from_an_openai_compatible_server(deployment: Deployment, api: ChatApi):
    chat_id = api.create_chat()
    message_id, events = api.ask(
        chat_id, "What is the capital of France?", deployment.completions_model, **GREEDY
    )
    kinds = [e.data["event_type"] for e in events]
    assert kinds.count("token") >= 1 and kinds[-1] == "message" and "error" not in kinds
    final = events[-1].data["message"]
    assert final["id"] == message_id and final["state"] == "complete"
    assert final["content"] == tokens_text(events) and "Paris" in final["content"]
    assert final["finish_reason"] in ("eos_token", "length")
    assert 1 <= final["generated_tokens"] <= GREEDY["max_new_tokens"]
    # Counted by the server's tokenizer (llama-cpp-python's /extras/tokenize/count).
    assert final["prompt_tokens"] > 5
    assert "<|im_" not in final["content"]

    # A follow-up turn carries the conversation, so its prompt is longer.
    _, second = api.ask(
        chat_id, "And of Italy?", deployment.completions_model, parent_id=message_id, **GREEDY
    )
    assert second[-1].data["event_type"] == "message"
    assert second[-1].data["message"]["prompt_tokens"] > final["prompt_tokens"]


def test_max_new_tokens_gives_finish_reason_length(deployment: Deployment, api: ChatApi):
    chat_id = api.create_chat()
    _, events = api.ask(
        chat_id,
        "Write a long story about a dragon.",
        deployment.completions_model,
        do_sample=False,
        max_new_tokens=5,
    )
    final = events[-1].data["message"]
    assert final["finish_reason"] == "length" and final["generated_tokens"] == 5


def test_chat_mode_lets_the_server_apply_its_template(deployment: Deployment, api: ChatApi):
    chat_id = api.create_chat()
    _, events = api.ask(chat_id, "What is the capital of France?", deployment.chat_model, **GREEDY)
    final = events[-1].data["message"]
    assert final["state"] == "complete" and final["content"].strip()
    assert final["content"] == tokens_text(events) and "<|im_" not in final["content"]
    assert final["finish_reason"] in ("eos_token", "length")


def test_cancel_closes_the_backend_stream(deployment: Deployment, api: ChatApi):
    disconnects = deployment.llama.log().count("Disconnected from client")
    chat_id = api.create_chat()
    prompter = api.prompter(chat_id, "Write a long story about a dragon who learns to bake bread.")
    prompter.raise_for_status()
    assistant = api.assistant(
        chat_id, prompter.json()["id"], deployment.completions_model, do_sample=False, max_new_tokens=1500
    )
    assistant.raise_for_status()
    message_id = assistant.json()["id"]
    first = api.events(chat_id, message_id, limit=4)
    kinds = [e.data["event_type"] for e in first]
    assert kinds.count("token") >= 2 and "message" not in kinds and "error" not in kinds

    api.client.post(f"/chats/{chat_id}/messages/{message_id}/cancel").raise_for_status()
    rest = api.events(chat_id, message_id, last_event_id=first[-1].id)
    final = rest[-1].data["message"]
    assert rest[-1].data["event_type"] == "message" and final["state"] == "cancelled"
    assert final["generated_tokens"] < 1500

    # The worker closed its HTTP stream and llama-cpp-python stopped decoding.
    deadline = time.monotonic() + 60
    while deployment.llama.log().count("Disconnected from client") <= disconnects:
        assert time.monotonic() < deadline, deployment.llama.log()[-3000:]
        time.sleep(0.2)
    # And the backend is free at once for the next answer.
    _, events = api.ask(
        api.create_chat(), "Hi!", deployment.completions_model, do_sample=False, max_new_tokens=4
    )
    assert events[-1].data["message"]["state"] == "complete"
