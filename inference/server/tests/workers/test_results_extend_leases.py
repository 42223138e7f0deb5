"""A worker's result says it is alive, as its pong does: its leases are extended when the result arrives,
before the result is stored. The receive loop reads the worker's next frame (its pong too) only after
the store, and at ``bench.many_streams``' release 10,000 answers ending within seconds queued for the
answers' connections longer than a lease: 24 messages a worker was still finishing were taken from it.
A real ``WorkerConnection`` with a stand-in socket, its lifecycle's store held until the test lets go."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any

from oasst_shared.protocol import ChatTurn, GeneratedText, Work
from oasst_shared.sampling import SamplingParameters
from tests.support.api import API
from tests.support.worker_socket import StandInSocket, stand_in_connection, until

pytestmark = API


class StubDispatcher:
    def capacity_changed(self) -> None:
        pass


class HeldStore:
    """The app's lifecycle with its answers' store held until ``let_go`` is set, and its lease asks
    recorded (session, the messages it holds) rather than run."""

    def __init__(self, lifecycle: Any) -> None:
        self._lifecycle = lifecycle
        self.let_go = asyncio.Event()
        self.storing: list[str] = []
        self.leases = self
        self.asked: list[tuple[str, frozenset[str]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lifecycle, name)

    async def complete(self, session_id: str, result: GeneratedText) -> bool:
        self.storing.append(result.message_id)
        await self.let_go.wait()
        return True

    def extend_soon(self, session_id: str, holding: Collection[str], on_stop: Any) -> None:
        self.asked.append((session_id, frozenset(holding)))

    def forget(self, session_id: str) -> None:
        pass


def work(message_id: str) -> Work:
    return Work(
        message_id=message_id,
        model_config_name="lease-model",
        thread=[ChatTurn(role="user", content="hello")],
        sampling_parameters=SamplingParameters(max_new_tokens=10),
    )


async def test_a_result_extends_the_worker_s_leases_before_it_is_stored(app) -> None:
    connection = stand_in_connection(app, "lease-model", StandInSocket(), StubDispatcher(), slots=2)
    store = HeldStore(app.state.lifecycle)
    connection._lifecycle = store  # type: ignore[assignment]
    for message_id in ("a", "b"):
        connection._start(message_id, work(message_id))
        connection._gate.settled(message_id)  # its claim committed
    result = GeneratedText(message_id="a", text="done", finish_reason="eos_token", generated_tokens=1)
    storing = asyncio.create_task(connection._on_generated(result))
    try:
        await until(lambda: store.storing == ["a"])
        # Stored or not, the worker's leases were asked for, for both of its messages: "b" is still
        # being generated while "a" waits for a connection.
        assert store.asked == [(connection.session_id, frozenset({"a", "b"}))]
    finally:
        store.let_go.set()
        await storing
    assert set(connection.in_flight) == {"b"}
