"""Several readers of one answer on a real server and Redis: one XREAD loop for all of them (counted
with Redis' MONITOR), every event to every reader once and in order, a reader resuming with
Last-Event-ID in the middle of the stream. (A reader that stops reading is tested against both brokers
in inference/server/tests/streams/test_stream_fanout.py: here the sockets' buffers would hide it.)"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
import redis.asyncio as aioredis

from tests.e2e.chat_api import ChatApi
from tests.support.fake_workers import fake_model, start_fake_worker
from tests.support.fault_flows import final_of, new_api, queue
from tests.support.services import REDIS_URL

pytestmark = pytest.mark.slow

TOKENS = 40  # [[slow]]: one token every 50 ms, so the readers follow a live stream for about 2 s


async def _count_xreads(key: str, seen: list[str], ready: asyncio.Event) -> None:
    """Every XREAD of ``key`` that Redis runs, from any client, while this runs."""
    client: Any = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        async with client.monitor() as monitor:
            ready.set()
            async for info in monitor.listen():
                command = str(info.get("command", ""))
                if command.upper().startswith("XREAD") and key in command:
                    seen.append(command)
    finally:
        await client.aclose()


def _ids(events) -> list[str]:
    return [event.id for event in events if event.id is not None]


def test_readers_of_one_answer_share_one_xread_loop_and_resume_mid_stream(fault_stack, fake_backend):
    model = fake_model()
    worker = start_fake_worker(fault_stack, fake_backend, model)
    api = new_api(fault_stack)
    prefix = fault_stack.server_env["OASST_SERVER_REDIS_KEY_PREFIX"]
    full_readers = 5

    async def scenario() -> tuple[list, list, list[str]]:
        chat_id, message_id = await asyncio.to_thread(
            queue, api, model.name, "[[slow]] for everyone", max_new_tokens=TOKENS
        )
        xreads: list[str] = []
        ready = asyncio.Event()
        monitor = asyncio.create_task(_count_xreads(f"{prefix}stream:events:{message_id}", xreads, ready))
        await asyncio.wait_for(ready.wait(), 10)

        def resume_in_the_middle() -> list:
            reader = ChatApi(fault_stack.url, api.username)
            first = reader.events(chat_id, message_id, limit=TOKENS // 2)
            rest = reader.events(chat_id, message_id, last_event_id=_ids(first)[-1])
            return [*first, *rest]

        try:
            results = await asyncio.gather(
                *(
                    asyncio.to_thread(ChatApi(fault_stack.url, api.username).events, chat_id, message_id)
                    for _ in range(full_readers)
                ),
                asyncio.to_thread(resume_in_the_middle),
            )
        finally:
            monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await monitor
        return list(results[:full_readers]), results[full_readers], xreads

    try:
        full, resumed, xreads = asyncio.run(scenario())
    finally:
        worker.stop()
    everything = _ids(full[0])
    assert len(everything) == TOKENS + 1  # every token and the terminal message event carry an id
    assert final_of(full[0])["message"]["content"] == "".join(f" w{i}" for i in range(1, TOKENS + 1))
    for events in full:
        assert _ids(events) == everything
    assert _ids(resumed) == everything  # the first half, then exactly the rest
    # One read loop for all six readers: its waiting XREADs each start where the previous one ended, so
    # no position is read twice; readers reading on their own would all read from the same positions.
    waiting = [command.split()[-1] for command in xreads if " BLOCK " in command.upper()]
    assert len(waiting) == len(set(waiting)) and len(waiting) <= TOKENS + 2, waiting
    # Besides, each reader reads what is stored once or twice on its own (when it joins, or resumes).
    assert len(xreads) <= len(waiting) + 3 * (full_readers + 1), len(xreads)
