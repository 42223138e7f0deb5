"""A worker speaking protocol 2 (before capabilities, tools and logprobs) still works with this server:
its work frames carry no protocol 3 field (it forbids unknown ones), and requests needing a capability it
never reported are refused with a 400 rather than answered without it."""

from __future__ import annotations

import asyncio
import json
import uuid

import openai
import pytest
from websockets.asyncio.client import connect

from oasst_shared.model_configs import SMOLLM2_135M
from oasst_shared.protocol import WorkerInfo, dump_frame
from tests.openai_api.conftest import new_user
from tests.support.processes import wait_for_model
from tests.support.stacks import WORKER_API_KEY, Stack

pytestmark = pytest.mark.slow


def protocol_2_hello(model: str) -> str:
    config = SMOLLM2_135M.model_copy(update={"name": model})
    info = json.loads(
        dump_frame(WorkerInfo(model_config=config, max_parallel_requests=1, backend_kind="fake"))
    )
    del info["capabilities"]  # a protocol 2 worker does not know the field
    return json.dumps(info)


async def test_a_protocol_2_worker_gets_work_it_can_read_and_no_requests_it_cannot_honour(
    embedded_stack: Stack,
) -> None:
    model = f"fake-v2-{uuid.uuid4().hex[:6]}"
    headers = {"X-API-Key": WORKER_API_KEY, "X-Protocol-Version": "2"}
    user = new_user(embedded_stack)
    client = user.client()
    async with connect(f"{embedded_stack.ws_url}/workers/work", additional_headers=headers) as ws:
        await ws.send(protocol_2_hello(model))
        await asyncio.to_thread(wait_for_model, embedded_stack.url, model)
        for refused, extra in (
            ("response_format", {"response_format": {"type": "json_object"}}),
            ("logprobs", {"logprobs": True}),
            ("tools", {"tools": [{"type": "function", "function": {"name": "f"}}]}),
        ):
            with pytest.raises(openai.BadRequestError, match=refused):
                await asyncio.to_thread(
                    client.chat.completions.create,
                    model=model,
                    messages=[{"role": "user", "content": "hi"}],
                    max_tokens=4,
                    **extra,
                )
        answer = asyncio.ensure_future(
            asyncio.to_thread(
                client.chat.completions.create,
                model=model,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=4,
            )
        )
        while True:
            frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
            if frame["type"] == "work":
                break
        assert "tools" not in frame and "tool_choice" not in frame
        message_id = frame["message_id"]
        await ws.send(json.dumps({"type": "token", "message_id": message_id, "text": "Hello"}))
        await ws.send(
            json.dumps(
                {
                    "type": "generated_text",
                    "message_id": message_id,
                    "text": "Hello",
                    "finish_reason": "eos_token",
                    "generated_tokens": 1,
                    "prompt_tokens": 3,
                }
            )
        )
        completion = await asyncio.wait_for(answer, 30)
    assert completion.choices[0].message.content == "Hello"
    user.http.close()
