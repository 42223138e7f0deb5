"""Which worker loads a model nobody serves, and which idle workers unload (the pure rules of
``fleet.load_choice`` and ``fleet.keep_alive``, on session records as replicas publish them)."""

from __future__ import annotations

from typing import Any

from oasst_inference_server.broker import WorkerSession
from oasst_inference_server.broker.worker_session import ServableSummary, SwitchOutcome, SwitchState
from oasst_inference_server.fleet.keep_alive import idle_past_keep_alive, keep_alive_models
from oasst_inference_server.fleet.load_choice import loaded_or_loading, models_to_load, worker_to_load
from oasst_shared.protocol import ServableModel
from tests.support.worker_socket import model_config

NOW = 1_000_000.0


def session(model: str, servable: list[str], **fields: Any) -> WorkerSession:
    load_seconds = fields.pop("load_seconds", {})
    keep_alive = fields.pop("keep_alive", None)
    return WorkerSession(
        model_config=model_config(model, keep_alive=keep_alive),
        max_parallel_requests=1,
        backend_kind="fake",
        connected_at=NOW - 3600,
        switchable=True,
        servable=[
            ServableSummary(name=name, model_id="m", load_seconds=load_seconds.get(name)) for name in servable
        ],
        **fields,
    )


def choose(
    sessions: dict[str, WorkerSession], model: str, queued: dict[str, int] | None = None, **kw: Any
) -> str | None:
    return worker_to_load(model, sessions, queued or {}, now=NOW, retry_backoff=60, **kw)


def test_an_unloaded_worker_is_chosen_first():
    sessions = {
        "ws-a": session("a", ["a", "b"]),
        "ws-b": session("a", ["a", "b"], loaded=False),
        "ws-c": session("c", ["c"]),
    }
    assert choose(sessions, "b") == "ws-b"


def test_then_an_idle_worker_whose_model_has_nothing_queued():
    sessions = {
        "ws-1": session("a", ["a", "b"], in_flight=["m1"]),
        "ws-2": session("a", ["a", "b"]),  # idle, but its model has work queued
        "ws-3": session("c", ["c", "b"]),  # idle, nothing queued for c
    }
    assert choose(sessions, "b", {"a": 2}) == "ws-3"
    assert choose(sessions, "b", {"a": 0}) == "ws-2"


def test_the_last_worker_of_a_model_with_work_is_never_taken():
    busy = {"ws-1": session("a", ["a", "b"], in_flight=["m1"])}
    assert choose(busy, "b") is None
    queued = {"ws-1": session("a", ["a", "b"])}
    assert choose(queued, "b", {"a": 1}) is None
    assert choose(queued, "b", {"a": 0}) == "ws-1"
    # With a second worker of that model, the busy one may go (after draining): the model keeps one.
    two = {"ws-1": session("a", ["a", "b"], in_flight=["m1"]), "ws-2": session("a", ["a"])}
    assert choose(two, "b", {"a": 3}) == "ws-1"


def test_the_fastest_measured_load_wins_a_tie():
    sessions = {
        "ws-1": session("x", ["b"], loaded=False, load_seconds={"b": 30.0}),
        "ws-2": session("x", ["b"], loaded=False, load_seconds={"b": 3.0}),
        "ws-3": session("x", ["b"], loaded=False),
    }
    assert choose(sessions, "b") == "ws-2"


def test_workers_that_cannot_take_the_model_s_work_are_skipped():
    failed = SwitchOutcome(
        action="load", model_config_name="b", outcome="failed", seconds=1, finished_at=NOW - 10
    )
    switching = SwitchState(
        request_id="r", action="load", model_config_name="c", from_model="x", started_at=NOW
    )
    sessions = {
        "ws-1": session("x", ["b"], loaded=False, switch=switching),
        "ws-2": session("x", ["b"], loaded=False, draining=True),
        "ws-3": session("x", ["b"], loaded=False, flagged=True),
        "ws-4": session("x", ["b"], loaded=False, last_switch=failed),  # failed 10 s ago
        "ws-5": session("x", ["c"], loaded=False),  # does not list it
    }
    assert choose(sessions, "b") is None
    assert worker_to_load("b", sessions, {}, now=NOW + 100, retry_backoff=60) == "ws-4"  # backoff over
    untrusted = {"ws-1": session("x", ["b"], loaded=False)}
    assert choose(untrusted, "b", trusted_only_models=["b"]) is None
    trusted = {"ws-1": session("x", ["b"], loaded=False, trusted=True)}
    assert choose(trusted, "b", trusted_only_models=["b"]) == "ws-1"


def test_a_model_served_or_being_loaded_needs_no_load():
    loading = SwitchState(
        request_id="r", action="load", model_config_name="b", from_model="a", started_at=NOW
    )
    sessions = [session("a", ["a", "b", "c"], switch=loading), session("d", ["d", "a"])]
    assert loaded_or_loading("b", sessions)
    assert not loaded_or_loading("a", sessions)  # its only worker is switching away
    assert models_to_load(sessions) == {"a", "c"}


def test_idle_workers_unload_after_their_keep_alive_when_nothing_waits():
    sessions = {
        "ws-idle": session("a", ["a"], keep_alive=60, idle_since=NOW - 61),
        "ws-recent": session("a", ["a"], keep_alive=60, idle_since=NOW - 59),
        "ws-busy": session("a", ["a"], keep_alive=60, idle_since=None, in_flight=["m"]),
        "ws-forever": session("f", ["f"], idle_since=NOW - 10_000),  # keep_alive null
        "ws-queued": session("q", ["q"], keep_alive=1, idle_since=NOW - 100),
        "ws-unloaded": session("u", ["u"], keep_alive=1, idle_since=NOW - 100, loaded=False),
    }
    assert keep_alive_models(sessions) == {"a", "q"}
    assert idle_past_keep_alive(sessions, {"q": 1}, NOW) == [("ws-idle", "a")]
    assert idle_past_keep_alive(sessions, {}, NOW) == [("ws-idle", "a"), ("ws-queued", "q")]


def test_a_servable_model_is_summarised_small_and_rebuilds_its_config():
    config = model_config(
        "q8",
        quantization="q8_0",
        chat_template_source="inline",
        chat_template="x" * 50_000,
        description="d" * 5000,
    )
    summary = ServableSummary.of(ServableModel(config=config, memory_bytes=10, load_seconds=1.5))
    assert len(summary.model_dump_json()) < 1000  # the record is written at every pong
    rebuilt = summary.config()
    assert rebuilt is not None
    assert (rebuilt.name, rebuilt.quantization, rebuilt.max_total_length) == (
        "q8",
        "q8_0",
        config.max_total_length,
    )
    assert rebuilt.chat_template is None
