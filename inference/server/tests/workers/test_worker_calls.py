"""Questions to a worker (protocol 4): each waits for the answer naming it, within its time, and fails
alone: a timeout, a refused or unexpected answer, a full or closed connection."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from oasst_inference_server.workers.worker_calls import CallFailed, WorkerCalls
from oasst_shared.protocol import Detokenize, Detokenized, Tokenize, Tokenized, TokenizeInput


class Wire:
    """What the connection would send; ``broken`` fails every send as a closed socket does."""

    def __init__(self) -> None:
        self.sent: list[BaseModel] = []
        self.broken = False

    async def send(self, frame: BaseModel) -> None:
        if self.broken:
            raise RuntimeError("the socket is closed")
        self.sent.append(frame)


def question(request_id: str) -> Tokenize:
    return Tokenize(request_id=request_id, inputs=[TokenizeInput(text="hello")])


async def answered_later(calls: WorkerCalls, reply: Tokenized | Detokenized) -> None:
    await asyncio.sleep(0.01)
    calls.answered(reply)


async def test_each_question_gets_the_answer_naming_it_in_any_order() -> None:
    wire = Wire()
    calls = WorkerCalls(wire.send)
    first = asyncio.create_task(calls.ask(question("a"), 5))
    second = asyncio.create_task(calls.ask(question("b"), 5))
    await asyncio.sleep(0.01)
    calls.answered(Tokenized(request_id="b", counts=[2]))
    calls.answered(Tokenized(request_id="zzz", counts=[9]))  # nobody asked: dropped
    calls.answered(Tokenized(request_id="a", counts=[1]))
    assert (await first).counts == [1] and (await second).counts == [2]
    assert [frame.request_id for frame in wire.sent] == ["a", "b"]  # type: ignore[attr-defined]
    assert calls.open_count == 0


async def test_a_question_fails_alone_on_a_timeout_an_error_or_a_wrong_answer() -> None:
    calls = WorkerCalls(Wire().send)
    with pytest.raises(CallFailed, match="did not answer within 0.05s"):
        await calls.ask(question("slow"), 0.05)
    calls.answered(Tokenized(request_id="slow", counts=[1]))  # too late: dropped
    asking = asyncio.create_task(calls.ask(question("e"), 5))
    await answered_later(calls, Tokenized(request_id="e", error="the backend cannot count tokens"))
    with pytest.raises(CallFailed, match="could not answer: the backend cannot count tokens"):
        await asking
    asking = asyncio.create_task(calls.ask(question("w"), 5))
    await answered_later(calls, Detokenized(request_id="w", texts=["x"]))
    with pytest.raises(CallFailed, match="answered a tokenize with detokenized"):
        await asking
    asking = asyncio.create_task(calls.ask(Detokenize(request_id="d", token_ids=[[1]]), 5))
    await asyncio.sleep(0.01)
    calls.refused("d", "texts.0: the text holds a NUL character")
    with pytest.raises(CallFailed, match="refused: texts.0"):
        await asking
    assert calls.open_count == 0


async def test_open_questions_are_bounded_and_fail_when_the_connection_ends() -> None:
    wire = Wire()
    calls = WorkerCalls(wire.send, max_open=2)
    waiting = [asyncio.create_task(calls.ask(question(f"q{i}"), 5)) for i in range(2)]
    await asyncio.sleep(0.01)
    with pytest.raises(CallFailed, match="2 questions open already"):
        await calls.ask(question("one too many"), 5)
    calls.close()
    for task in waiting:
        with pytest.raises(CallFailed, match="connection ended"):
            await task
    with pytest.raises(CallFailed, match="has ended"):
        await calls.ask(question("after"), 5)
    broken = Wire()
    broken.broken = True
    with pytest.raises(CallFailed, match="could not be sent"):
        await WorkerCalls(broken.send).ask(question("x"), 5)
