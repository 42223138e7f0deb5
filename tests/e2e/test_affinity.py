"""Affinity with the real model: two workers, each with a backend of its own, and conversations whose
every follow-up goes to the worker that answered its previous turn, whose backend serves the
conversation from its prefix cache (``cached_tokens`` > 0 on the chat API and in the Responses API's
usage); the server's hit counter says so."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.e2e.chat_api import ChatApi
from tests.openai_api.conftest import ApiUser
from tests.support.fault_flows import final_of
from tests.support.processes import wait_for_model
from tests.support.services import fresh_database
from tests.support.stacks import MODEL_NAME, BackendProcess, Stack, start_cpu_backend, start_stack

pytestmark = pytest.mark.slow

# With its answer, longer than a prefill chunk (64 tokens): what a backend's cache can serve. Each
# conversation starts with its own words, so no other conversation's cache shares a chunk with it (the
# system prompt alone is shorter than a chunk).
OPENING = (
    "I am planning a trip to Lisbon in the spring with my family: two children and a grandmother who walks "
    "slowly. We like museums, gardens, bakeries, trams and quiet streets by the river. What should we see "
    "on the first day?"
)
FOLLOW_UPS = ["And on the second day?", "Where should we eat?"]


@pytest.fixture(scope="module")
def second_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackendProcess]:
    backend = start_cpu_backend(tmp_path_factory.mktemp("second-backend"))
    yield backend
    backend.process.stop()


@pytest.fixture(scope="module")
def two_worker_stack(
    cpu_backend: BackendProcess, second_backend: BackendProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    log_dir: Path = tmp_path_factory.mktemp("affinity-stack")
    with fresh_database("oasst_affinity") as database:
        stack = start_stack(log_dir, cpu_backend.url, database, None, workers=0)
        try:
            # One job at a time each: two first turns sent together go one to each worker.
            stack.start_worker(cpu_backend.url, OASST_WORKER_MAX_PARALLEL_REQUESTS="1")
            stack.start_worker(second_backend.url, OASST_WORKER_MAX_PARALLEL_REQUESTS="1")
            wait_for_model(stack.url, MODEL_NAME, workers=2)
            yield stack
        finally:
            stack.stop()


def affinity_counts(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    counts = {"hit": 0.0, "miss": 0.0}
    for outcome, value in re.findall(
        r'oasst_server_affinity_dispatches_total\{[^}]*outcome="(\w+)"[^}]*\} (\S+)', text
    ):
        counts[outcome] = float(value)
    return counts


def test_chat_follow_ups_go_to_the_worker_that_holds_their_conversation(two_worker_stack: Stack) -> None:
    """Two conversations whose first turns run at once, one on each worker; then their follow-ups, one at
    a time, with both workers idle: without affinity both would go to the same worker (the faster, or
    the lower session id), and one conversation would find nothing in its cache."""
    before = affinity_counts(two_worker_stack.url)
    api = ChatApi(two_worker_stack.url, f"affinity-{uuid.uuid4().hex[:8]}")
    openings = ["Hello! " + OPENING, "Good morning! " + OPENING]
    chats = [api.create_chat() for _ in openings]
    with ThreadPoolExecutor(2) as pool:
        firsts = list(pool.map(lambda pair: ask(api, *pair), zip(chats, openings, [None, None], strict=True)))
    parents = [message["id"] for message in firsts]
    for content in FOLLOW_UPS:
        for index, chat_id in enumerate(chats):
            message = ask(api, chat_id, content, parents[index])
            # Its backend held the previous turns: a prefill chunk of them at least came from its cache.
            assert message["cached_tokens"] >= 64, message
            parents[index] = message["id"]
    after = affinity_counts(two_worker_stack.url)
    follow_ups = len(FOLLOW_UPS) * len(chats)
    assert after["hit"] - before["hit"] == follow_ups and after["miss"] == before["miss"]


def ask(api: ChatApi, chat_id: str, content: str, parent: str | None) -> dict:
    _, events = api.ask(chat_id, content, MODEL_NAME, parent, do_sample=False, max_new_tokens=40)
    message = final_of(events)["message"]
    assert message["state"] == "complete", message
    return dict(message)


def test_a_responses_follow_up_reports_its_cached_tokens(two_worker_stack: Stack) -> None:
    user = ApiUser(two_worker_stack.url, f"affinity-{uuid.uuid4().hex[:8]}")
    client = user.client(str(user.create_key()["key"]))
    opening = "Good evening! " + OPENING
    first = client.responses.create(model=MODEL_NAME, input=opening, max_output_tokens=40, temperature=0)
    second = client.responses.create(
        model=MODEL_NAME,
        input=FOLLOW_UPS[0],
        previous_response_id=first.id,
        max_output_tokens=40,
        temperature=0,
    )
    assert first.usage is not None and second.usage is not None
    assert second.usage.input_tokens_details.cached_tokens >= 64, second.usage
    assert second.usage.input_tokens_details.cached_tokens <= second.usage.input_tokens
