"""Whether a message has a reader now, on any replica: what an abandoned ``/v1`` stream's grace asks before
it cancels (``reader_slots.resumed_readers``). The probe leaves nothing behind and takes no reader's slot."""

from __future__ import annotations

from oasst_inference_server.broker import Broker
from oasst_inference_server.settings import Settings
from oasst_inference_server.streams.reader_slots import acquire_reader, resumed_readers


async def test_a_reader_holding_its_slot_is_seen_and_one_that_left_is_not(broker: Broker) -> None:
    settings = Settings(max_sse_readers_per_message=2)
    assert not await resumed_readers(broker, "m1")
    lease = await acquire_reader(broker, settings, "user", "m1")
    async with lease.held():
        assert await resumed_readers(broker, "m1")
        assert not await resumed_readers(broker, "m2")  # another message
        # The probes took nothing: the message still has its second slot for another reader.
        assert not await resumed_readers(broker, "m2")
        second = await acquire_reader(broker, settings, "user", "m1")
        await second.release()
    assert not await resumed_readers(broker, "m1")
