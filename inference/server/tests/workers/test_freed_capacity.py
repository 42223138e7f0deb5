"""A job that ends gives its worker's slot and KV-cache room back at once. A worker whose last pong said its
KV cache was full (every slot busy: the bundled backend counts the free slots' streams) takes the next job
then, not at its next pong seconds later: on ``make up``, four back-to-back streams had their next turns
wait 7-8 s for the pong. A real ``WorkerConnection`` with a stand-in socket."""

from __future__ import annotations

from oasst_inference_server.scheduling.fair_share import CHARS_PER_TOKEN
from oasst_shared.protocol import ChatTurn, Pong, Work
from oasst_shared.sampling import SamplingParameters
from tests.support.api import API
from tests.support.worker_socket import StandInSocket, stand_in_connection

pytestmark = API


class StubDispatcher:
    def __init__(self) -> None:
        self.changes = 0

    def capacity_changed(self) -> None:
        self.changes += 1


def work(message_id: str, prompt: str, max_new_tokens: int) -> Work:
    return Work(
        message_id=message_id,
        model_config_name="freed-model",
        thread=[ChatTurn(role="user", content=prompt)],
        sampling_parameters=SamplingParameters(max_new_tokens=max_new_tokens),
    )


async def test_an_ended_job_frees_its_slot_and_kv_room_before_the_next_pong(app) -> None:
    dispatcher = StubDispatcher()
    connection = stand_in_connection(app, "freed-model", StandInSocket(), dispatcher, slots=2)
    prompt = "Tell me a long story about a lighthouse keeper."
    for message_id in ("a", "b"):
        connection._start(message_id, work(message_id, prompt, 100))
    # Both slots busy: the worker's pong says no slot and no KV cache is free.
    await connection._on_pong(Pong(ping_id="full", free_slots=0, kv_cache_free_tokens=0))
    capacity = connection.capacity
    needed = len(prompt) // CHARS_PER_TOKEN + 100  # the next job, placed as the dispatcher counts it
    assert capacity.free_slots == 0 and not capacity.fits(needed)

    changes = dispatcher.changes
    connection._done("a")
    assert capacity.free_slots == 1 and capacity.fits(needed)
    assert capacity.kv_cache_free_tokens == needed
    assert dispatcher.changes > changes  # the dispatcher is told: it places the next job now

    # The next pong says again what is free: its figures replace the counted ones.
    await connection._on_pong(Pong(ping_id="again", free_slots=1, kv_cache_free_tokens=2048))
    assert capacity.kv_cache_free_tokens == 2048 and capacity.free_slots == 1
