"""The worker-session record: one typed model, written by the connection, read by every replica."""

from __future__ import annotations

import json

from oasst_inference_server.broker import WorkerSession, WorkerSessionRecord
from oasst_shared.model_configs import SMOLLM2_135M
from oasst_shared.protocol import WorkerCapabilities


def test_a_session_survives_the_broker_and_keeps_its_wire_names():
    session = WorkerSession(
        model_config=SMOLLM2_135M,
        max_parallel_requests=4,
        free_slots=2,
        in_flight=["m-1", "m-2"],
        backend_kind="tgi",
        capabilities=WorkerCapabilities(logprobs=True),
        connected_at=1700000000.0,
        worker_id="w-1",
        tokens_per_second=31.5,
    )
    record = session.record("ws-1")
    assert (record.session_id, record.model_config_name) == ("ws-1", SMOLLM2_135M.name)
    assert json.loads(record.data)["model_config"]["name"] == SMOLLM2_135M.name
    assert WorkerSession.of(record) == session


def test_a_record_of_an_older_replica_reads_with_defaults_and_a_broken_one_is_skipped():
    older = {
        "model_config": SMOLLM2_135M.model_dump(mode="json"),
        "max_parallel_requests": 2,
        "backend_kind": "cpu",
        "connected_at": 0.0,
        "a_field_of_a_newer_replica": 1,
    }
    read = WorkerSession.of(WorkerSessionRecord("ws-old", SMOLLM2_135M.name, json.dumps(older)))
    assert read is not None
    assert (read.free_slots, read.in_flight, read.worker_id, read.tokens_per_second) == (0, [], None, None)
    assert read.capabilities == WorkerCapabilities()
    for data in ("not json", "{}", json.dumps({**older, "model_config": {"name": "no model id"}})):
        assert WorkerSession.of(WorkerSessionRecord("ws-bad", "m", data)) is None
