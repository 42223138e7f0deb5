"""A silent stream whose message is in progress asks for its state less and less often: the wait between
its state checks doubles from ``pending_update_interval`` up to ``MAX_SILENT_WAIT`` and starts over at
the next event. A waiting (pending) message keeps its queue-position updates every interval. Driven with
a stand-in stream and state checks (no clock: each read returns at once and records its wait)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from oasst_inference_server import events
from oasst_inference_server.broker import StreamEntry
from oasst_inference_server.streams.event_reader import MAX_SILENT_WAIT, read_message_events
from oasst_shared.schemas import MessageState

INTERVAL = 1.0


class ScriptedStream:
    """What each read returns, in order (an empty list: nothing came within the wait)."""

    def __init__(self, script: list[list[StreamEntry]]) -> None:
        self.script = script
        self.waits: list[float] = []

    async def read(self, timeout: float) -> list[StreamEntry]:
        self.waits.append(timeout)
        return self.script.pop(0) if self.script else []


class Fanout:
    def __init__(self, stream: ScriptedStream) -> None:
        self.stream = stream
        self.broker = None

    @contextlib.asynccontextmanager
    async def subscribe(self, stream: str, after: str | None) -> AsyncIterator[ScriptedStream]:
        yield self.stream


class StateChecks:
    def __init__(self, states: list[MessageState]) -> None:
        self.states = states
        self.asked = 0

    async def state(self, message_id: str) -> MessageState | None:
        self.asked += 1
        return self.states.pop(0)


class Reads:
    def __init__(self, states: list[MessageState], message: Any) -> None:
        self.state_checks = StateChecks(states)
        self.message = message

    async def get(self, message_id: str) -> Any:
        return self.message

    def final_event(self, message: Any) -> str:
        return events.error_event("ended", None)

    async def queue_position(self, message: Any) -> tuple[int, int, float | None]:
        return 1, 1, None

    async def model_loading(self, message: Any) -> bool:
        return False


async def connected() -> bool:
    return False


async def read_all(reads: Reads, stream: ScriptedStream, message: Any) -> list[list[dict[str, str]]]:
    settings = SimpleNamespace(pending_update_interval=INTERVAL)
    reader = read_message_events(reads, Fanout(stream), settings, message, None, connected)  # type: ignore[arg-type]
    return [batch async for batch in reader]


def message(state: MessageState) -> Any:
    return SimpleNamespace(id="m1", state=state, finished_at=None, model_config_name="m")


async def test_a_silent_message_in_progress_is_checked_ever_later_and_an_event_starts_over() -> None:
    token = StreamEntry("1-0", events.token_event("hi"))
    silent = [[]] * 6
    # Six silent reads, a token, three silent reads, then the stream's own terminal event.
    end = StreamEntry("2-0", events.error_event("ended", None))
    stream = ScriptedStream([*silent, [token], [], [], [], [end]])
    reads = Reads([MessageState.in_progress] * 9, message(MessageState.in_progress))
    batches = await read_all(reads, stream, message(MessageState.in_progress))
    assert [event["id"] for batch in batches for event in batch] == ["1-0", "2-0"]
    assert MAX_SILENT_WAIT == 8.0
    assert stream.waits == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0, 1.0, 2.0, 4.0, 8.0]
    assert reads.state_checks.asked == 9


async def test_a_waiting_message_keeps_its_updates_every_interval() -> None:
    stream = ScriptedStream([[], [], [], [StreamEntry("1-0", events.error_event("ended", None))]])
    reads = Reads([MessageState.pending] * 3, message(MessageState.pending))
    batches = await read_all(reads, stream, message(MessageState.in_progress))
    assert [event["data"] for event in batches[0]] == [events.pending_event(1, 1, None, loading_model=False)]
    assert len(batches) == 4
    assert stream.waits == [INTERVAL] * 4
