"""Who is asked to count a prompt (``workers.prompt_sizes``) is worked out once per change of the workers,
not over all of them per request: with a thousand workers that do not count (the benchmarks' synthetic
ones), every request without a bound used to scan this process's workers and every replica's sessions."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from oasst_inference_server.broker import InMemoryBroker
from oasst_inference_server.broker.session_view import SessionSnapshot
from oasst_inference_server.scheduling.capacity import WorkerCapacity
from oasst_inference_server.scheduling.dispatcher import Dispatchers
from oasst_inference_server.workers.prompt_sizes import PromptSizes
from oasst_shared.protocol import ChatTurn, PromptConversation, TokenizeInput


class NotCounting:
    """A connection of this process that does not count (protocol < 4): its ``tokenizes`` reads counted."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.capacity = WorkerCapacity(session_id, declared_slots=1)
        self.asked = 0

    @property
    def tokenizes(self) -> bool:
        self.asked += 1
        return False


class RemoteSession:
    """Another replica's worker that does not count: how often its session is looked at."""

    def __init__(self) -> None:
        self.looked_at = 0

    @property
    def serves(self) -> str:
        self.looked_at += 1
        return "m"

    capabilities = SimpleNamespace(tokenize=False)
    draining = flagged = trusted = False


class Sessions:
    def __init__(self, sessions: dict[str, Any]) -> None:
        self.current = SessionSnapshot(sessions, 0.0, 0)  # type: ignore[arg-type]

    async def snapshot(self) -> SessionSnapshot:
        return self.current


async def test_the_workers_that_can_count_are_listed_once_per_change_of_the_workers() -> None:
    dispatchers = Dispatchers(InMemoryBroker(), lifecycle=None)  # type: ignore[arg-type]
    dispatcher = dispatchers.for_model("m")
    here = [NotCounting(f"ws-{n}") for n in range(3)]
    for connection in here:
        dispatcher.attach(connection)  # type: ignore[arg-type]
    there = {f"ws-remote-{n}": RemoteSession() for n in range(3)}
    sessions = Sessions(there)
    # Other replicas' workers are asked through ``remote`` only if one counts: none does here.
    remote: Any = SimpleNamespace()
    sizes = PromptSizes(dispatchers, timeout=1.0, sessions=sessions, remote=remote)  # type: ignore[arg-type]
    # No calibration for the model: no bound, so each request looks for a worker to count it.
    prompt = TokenizeInput(conversation=PromptConversation(thread=[ChatTurn(role="user", content="Hi")]))
    late = NotCounting("ws-late")
    try:
        for _ in range(10):
            assert await sizes.size("m", prompt, limit=100) is None  # nobody counts: admitted unchecked
        assert [c.asked for c in here] == [1, 1, 1]
        assert [s.looked_at for s in there.values()] == [1, 1, 1]
        # A new read of the sessions, a worker arriving here: each list is made again, once.
        sessions.current = SessionSnapshot(there, 1.0, 0)  # type: ignore[arg-type]
        dispatcher.attach(late)  # type: ignore[arg-type]
        for _ in range(10):
            assert await sizes.size("m", prompt, limit=100) is None
        assert [c.asked for c in [*here, late]] == [2, 2, 2, 1]
        assert [s.looked_at for s in there.values()] == [2, 2, 2]
    finally:
        for connection in [*here, late]:
            await dispatcher.detach(connection)  # type: ignore[arg-type]
