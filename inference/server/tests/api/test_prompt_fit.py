"""A prompt that cannot fit its model is known at submission: the server sizes it with a bound, or has a
worker of the model count it (protocol 4 ``tokenize``), before anything is queued.

The worker here is a stand-in on a real ``WorkerConnection`` of the app: it counts a token per four
bytes of the prompt (the rendered prompt of a conversation being its text plus ``OVERHEAD`` bytes of
template) and answers every job at once. The real tokenizer is the CPU backend's, in
``tests/e2e/test_prompt_length.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from oasst_inference_server.workers.worker_connection import WorkerConnection
from oasst_shared.protocol import (
    GeneratedText,
    PromptConversation,
    Tokenized,
    TokenizeInput,
    WorkerCapabilities,
)
from oasst_shared.token_bounds import utf8_bytes
from tests.support.api import API, User, start_chat
from tests.support.worker_socket import StandInSocket, stand_in_connection, until

pytestmark = API

OVERHEAD = 60  # bytes the stand-in's "template" adds to a conversation
LIMIT = 256  # the stand-in worker's model's max_input_length (messages here are at most 2,000 characters)
LONG = "The committee met again to discuss the budget. " * 40  # 1,880 characters, ~500 "tokens"
MEDIUM = "A question of some length, asked with care. " * 9  # 396 bytes: over the bound, fits


def rendered_bytes(item: TokenizeInput) -> int:
    if item.text is not None:
        return utf8_bytes(item.text)
    conversation: PromptConversation = item.conversation  # type: ignore[assignment]
    text = utf8_bytes(conversation.system_prompt or "") + sum(
        utf8_bytes(t.content) for t in conversation.thread
    )
    return text + OVERHEAD


class CountingWorker:
    """Plays a worker of protocol 4 on ``socket``: answers tokenize frames (unless ``silent``) and jobs."""

    def __init__(self, socket: StandInSocket) -> None:
        self.socket = socket
        self.silent = False
        self.malformed = False
        self.lying = False  # counts no tokenizer could give: a token per byte, and 100 more
        self.seen = 0

    def frames(self, kind: str) -> list[dict[str, Any]]:
        return [frame for frame in self.socket.sent if frame["type"] == kind]

    async def run(self) -> None:
        while True:
            while self.seen < len(self.socket.sent):
                frame = self.socket.sent[self.seen]
                self.seen += 1
                if frame["type"] == "tokenize" and not self.silent:
                    self.answer_count(frame)
                elif frame["type"] == "work":
                    self.socket.say(
                        GeneratedText(
                            message_id=frame["message_id"],
                            text="ok",
                            finish_reason="eos_token",
                            generated_tokens=1,
                        )
                    )
            await asyncio.sleep(0.005)

    def answer_count(self, frame: dict[str, Any]) -> None:
        if self.malformed:  # a count the protocol refuses: the question fails, the connection stays
            text = json.dumps({"type": "tokenized", "request_id": frame["request_id"], "counts": [-1]})
            self.socket.incoming.put_nowait({"type": "websocket.receive", "text": text})
            return
        items = [TokenizeInput.model_validate(item) for item in frame["inputs"]]
        sizes = [rendered_bytes(item) for item in items]
        counts = [s + 100 if self.lying else s // 4 + 1 for s in sizes]
        self.socket.say(Tokenized(request_id=frame["request_id"], counts=counts, prompt_bytes=sizes))


@contextlib.asynccontextmanager
async def counting_worker(
    app: Any,
    *,
    overhead: int | None = OVERHEAD,
    protocol_version: int = 4,
    model: str | None = None,
    **config: Any,
) -> AsyncIterator[tuple[str, CountingWorker, WorkerConnection]]:
    """A model of its own (or ``model``), served by a stand-in worker of this process that counts prompts."""
    model = model or f"fit-{uuid.uuid4().hex[:8]}"
    config = {"max_input_length": LIMIT, "max_total_length": 512, **config}
    socket = StandInSocket()
    capabilities = WorkerCapabilities(tokenize=protocol_version >= 4, prompt_overhead_bytes=overhead)
    dispatcher = app.state.dispatchers.for_model(model)
    connection = stand_in_connection(
        app,
        model,
        socket,
        dispatcher,
        slots=4,
        capabilities=capabilities,
        protocol_version=protocol_version,
        config=config,
    )
    worker = CountingWorker(socket)
    tasks = [asyncio.create_task(connection.run()), asyncio.create_task(worker.run())]
    try:
        await until(lambda: connection.session_id in dispatcher.workers and dispatcher.waiting)
        await until(lambda: _live(app, model))
        yield model, worker, connection
    finally:
        socket.hang_up()
        tasks[1].cancel()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)


async def _live(app: Any, model: str) -> bool:
    return model in await app.state.registry.live_models(wanted=model)


def chat_body(model: str, content: str, system: str | None = None) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}] if system else []
    messages += [
        {"role": "user", "content": "an old question"},
        {"role": "assistant", "content": "an answer"},
    ]
    return {"model": model, "messages": [*messages, {"role": "user", "content": content}], "max_tokens": 4}


def context_length_error(response: Any) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["type"] == "invalid_request_error", error
    return str(error["message"])


async def test_v1_refuses_a_prompt_over_the_limit_with_both_numbers_and_queues_nothing(
    client, app, user: User
) -> None:
    async with counting_worker(app) as (model, worker, _):
        response = await client.post(
            "/v1/chat/completions", json=chat_body(model, LONG), headers=user.headers
        )
        message = context_length_error(response)
        tokens = (utf8_bytes(LONG) + OVERHEAD) // 4 + 1  # the system prompt and the last message only
        assert (
            f"maximum input length is {LIMIT} tokens" in message and f"resulted in {tokens} tokens" in message
        )
        assert response.json()["error"]["param"] == "messages"
        ((question,),) = [frame["inputs"] for frame in worker.frames("tokenize")]
        assert question["conversation"]["thread"] == [
            {"role": "user", "content": LONG, "tool_calls": None, "tool_call_id": None}
        ]
        assert worker.frames("work") == []
        # Counted once: the same prompt again is refused from the remembered count.
        again = await client.post("/v1/chat/completions", json=chat_body(model, LONG), headers=user.headers)
        assert f"resulted in {tokens} tokens" in context_length_error(again)
        assert len(worker.frames("tokenize")) == 1
        prompt = await client.post(
            "/v1/completions", json={"model": model, "prompt": LONG, "max_tokens": 4}, headers=user.headers
        )
        assert f"your prompt resulted in {utf8_bytes(LONG) // 4 + 1} tokens" in context_length_error(prompt)
        assert prompt.json()["error"]["param"] == "prompt"


async def test_most_prompts_are_not_counted_and_a_long_one_that_fits_is_answered(
    client, app, user: User
) -> None:
    async with counting_worker(app) as (model, worker, _):
        short = await client.post(
            "/v1/chat/completions", json=chat_body(model, "Hello!"), headers=user.headers
        )
        assert short.status_code == 200, short.text
        assert worker.frames("tokenize") == []  # its bound fits: no round trip
        medium = await client.post(
            "/v1/chat/completions", json=chat_body(model, MEDIUM, system="Be brief."), headers=user.headers
        )
        assert medium.status_code == 200, medium.text
        assert len(worker.frames("tokenize")) == 1 and len(worker.frames("work")) == 2


async def test_a_model_is_calibrated_by_the_counts_of_its_workers(client, app, user: User) -> None:
    """Workers that report no template overhead: the first count shows it, then short prompts need none."""
    async with counting_worker(app, overhead=None) as (model, worker, _):
        for content in ("Hello!", "Hi there, how are you?"):
            response = await client.post(
                "/v1/chat/completions", json=chat_body(model, content), headers=user.headers
            )
            assert response.status_code == 200, response.text
        assert len(worker.frames("tokenize")) == 1


async def test_a_prompt_nobody_counts_in_time_is_admitted_unchecked(client, app, user: User) -> None:
    async with counting_worker(app) as (model, worker, connection):
        worker.silent = True
        response = await client.post(
            "/v1/chat/completions", json=chat_body(model, LONG), headers=user.headers
        )
        assert response.status_code == 200, response.text  # the worker decides (here: it answers)
        assert len(worker.frames("tokenize")) == 1 and connection.calls.open_count == 0
        worker.silent, worker.malformed = False, True
        refused = await client.post(
            "/v1/completions", json={"model": model, "prompt": LONG}, headers=user.headers
        )
        assert refused.status_code == 200, refused.text  # the refused answer failed only its question
        assert len(worker.frames("tokenize")) == 2 and connection.websocket.closed_with is None


async def test_a_protocol_3_worker_is_never_asked_and_gets_work_it_can_read(client, app, user: User) -> None:
    async with counting_worker(app, protocol_version=3) as (model, worker, _):
        response = await client.post(
            "/v1/chat/completions", json=chat_body(model, LONG), headers=user.headers
        )
        assert response.status_code == 200, response.text
        assert worker.frames("tokenize") == []
        (work,) = worker.frames("work")
        assert "cut_newest_turn" not in work  # a protocol 3 worker forbids the field


async def test_the_chat_api_cuts_a_long_message_on_the_worker_or_refuses_it_by_the_model_config(
    client, app, user: User
) -> None:
    async with counting_worker(app) as (model, worker, _):
        conversation = await start_chat(client, user, LONG, model)  # cut (the default): accepted
        assert conversation.assistant_id is not None
        await until(lambda: len(worker.frames("work")) == 1)
        (work,) = worker.frames("work")
        assert work["cut_newest_turn"] is True and worker.frames("tokenize") == []
        # A system prompt that alone is over the limit cannot be helped by a cut.
        refused = await client.post(
            f"/chats/{conversation.chat_id}/assistant_message",
            json={
                "parent_id": conversation.prompter_id,
                "model_config_name": model,
                "system_prompt": "Rules. " * 200,
            },
            headers=user.headers,
        )
        assert refused.status_code == 400 and refused.json()["code"] == "context_length_exceeded", (
            refused.text
        )
        assert "the system prompt needs" in refused.json()["detail"]
    async with counting_worker(app, chat_prompt_overflow="refuse") as (model, worker, _):
        chat = (await client.post("/chats", json={}, headers=user.headers)).json()["id"]
        turn = await client.post(
            f"/chats/{chat}/turns", json={"content": LONG, "model_config_name": model}, headers=user.headers
        )
        assert turn.status_code == 400 and turn.json()["code"] == "context_length_exceeded", turn.text
        tokens = (utf8_bytes(LONG) + OVERHEAD) // 4 + 1
        assert f"need {tokens} tokens" in turn.json()["detail"] and f"takes {LIMIT}" in turn.json()["detail"]
        assert (await client.get(f"/chats/{chat}", headers=user.headers)).json()[
            "messages"
        ] == []  # nothing kept
        ok = await client.post(
            f"/chats/{chat}/turns",
            json={"content": "Hello!", "model_config_name": model},
            headers=user.headers,
        )
        assert ok.status_code == 200, ok.text
        await until(lambda: len(worker.frames("work")) == 1)
        assert worker.frames("work")[0]["cut_newest_turn"] is False


async def test_a_count_comes_from_a_trusted_worker_first_and_an_impossible_one_is_not_used(
    client, app, user: User
) -> None:
    async with counting_worker(app) as (model, liar, connection):
        liar.lying = True
        # Alone: its count (more tokens than bytes) is not believed; the request is admitted unchecked.
        response = await client.post(
            "/v1/completions", json={"model": model, "prompt": MEDIUM}, headers=user.headers
        )
        assert response.status_code == 200, response.text
        assert len(liar.frames("tokenize")) == 1
        # A trusted worker of the model joins: it is asked first, and its count refuses the long prompt.
        async with counting_worker(app, model=model) as (_, honest, trusted):
            trusted.trust.trusted = True
            refused = await client.post(
                "/v1/completions", json={"model": model, "prompt": LONG}, headers=user.headers
            )
            assert f"resulted in {utf8_bytes(LONG) // 4 + 1} tokens" in context_length_error(refused)
            assert len(honest.frames("tokenize")) == 1 and len(liar.frames("tokenize")) == 1
            # A flagged worker is never asked, trusted or not.
            trusted.trust.flagged = True
            other = LONG.replace("budget", "bridge")
            refused = await client.post(
                "/v1/completions", json={"model": model, "prompt": other}, headers=user.headers
            )
            assert refused.status_code == 200, refused.text  # the liar was asked instead: not believed
            assert len(honest.frames("tokenize")) == 1 and len(liar.frames("tokenize")) == 2
