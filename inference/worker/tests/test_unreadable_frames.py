"""A server frame the worker cannot read: work that names its message is answered with a final error
for that message (the server fails it at once, instead of waiting for an answer that never comes);
anything else is logged and ignored."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pydantic import BaseModel

from oasst_shared.model_configs import SMOLLM2_135M
from oasst_shared.protocol import ChatTurn, Work, WorkerError, dump_frame
from oasst_worker.connection.client import WorkerClient
from oasst_worker.jobs.generation import GenerationJobFactory
from oasst_worker.settings import WorkerSettings
from tests.support.worker_jobs import OneToken

CONFIG = SMOLLM2_135M.model_copy(update={"chat_template_source": "chatml"})


async def receive(raw: str) -> list[BaseModel]:
    """Hand a fresh client one raw server frame; what it sends back within a second."""
    client = WorkerClient(WorkerSettings(), GenerationJobFactory(OneToken(), CONFIG))
    client._health.healthy = True
    sent: list[BaseModel] = []

    async def send(frame: BaseModel) -> None:
        sent.append(frame)

    client._send = send  # type: ignore[method-assign]  # the socket edge
    await client._handle(raw)
    for _ in range(20):
        await asyncio.sleep(0.05)
    return sent


def deep_work(message_id: str, depth: int = 200) -> str:
    """A work frame whose response_format schema is nested deeper than the worker's parser goes."""
    schema: dict[str, Any] = {}
    for _ in range(depth):
        schema = {"a": schema}
    work = json.loads(
        dump_frame(
            Work(
                message_id=message_id,
                model_config_name=CONFIG.name,
                thread=[ChatTurn(role="user", content="hi")],
            )
        )
    )
    work["sampling_parameters"]["response_format"] = {
        "type": "json_schema",
        "json_schema": {"name": "deep", "schema": schema},
    }
    return json.dumps(work)


async def test_work_too_deep_to_parse_is_answered_with_an_error_for_its_message() -> None:
    [error] = await receive(deep_work("m-deep"))
    assert isinstance(error, WorkerError) and error.message_id == "m-deep"
    assert not error.retryable and not error.backend_unavailable
    assert "cannot read the work frame" in error.error and "recursion" in error.error


async def test_work_the_schema_refuses_is_answered_too() -> None:
    work = json.loads(deep_work("m-bad", depth=1))
    work["thread"] = []  # a work frame needs a turn
    [error] = await receive(json.dumps(work))
    assert isinstance(error, WorkerError) and error.message_id == "m-bad" and "thread" in error.error


async def test_a_readable_frame_is_work_as_usual() -> None:
    sent = await receive(deep_work("m-ok", depth=3))
    assert sent and not any(isinstance(f, WorkerError) for f in sent)


async def test_a_malformed_frame_that_gives_no_work_is_not_answered() -> None:
    assert await receive('{"type": "cancel", "message_id": 5}') == []
    assert await receive("not json") == []
    assert await receive('{"type": "work", "thread": []}') == []  # no message to answer for
