"""Compliance checks, the pure parts: the check job, the comparison rule, which workers are compared,
and which workers may take user work."""

from __future__ import annotations

import pytest

from oasst_inference_server.openai_protocol.generation_requests import ChatCompletionRequest
from oasst_inference_server.scheduling.capacity import WorkerCapacity, choose_worker
from oasst_inference_server.workers.compliance_rules import (
    CHECK_PROMPTS,
    Identity,
    check_work,
    compare,
    edit_distance,
)
from oasst_inference_server.workers.trust import WorkerTrust

A = Identity("m", "org/model", "sha256:1", "version 1, llama.cpp 0.3")


def test_a_check_is_the_work_a_greedy_api_request_makes():
    work = check_work("0b7c0f6e-1111-4c3a-9d4e-123456789abc", "m", 3, 32)
    user = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": CHECK_PROMPTS[3]}],
            "temperature": 0,
            "seed": work.sampling_parameters.seed,
            "max_tokens": 32,
        }
    )
    assert work.sampling_parameters == user.to_sampling_parameters(32)
    assert work.sampling_parameters.is_greedy and work.sampling_parameters.seed is not None
    assert work.chat_id is None and work.attempt == 1 and work.raw_prompt is None
    assert [t.content for t in work.thread] == [CHECK_PROMPTS[3]]
    # The same prompt is the same job (so a kept answer applies), whatever the message id.
    assert check_work("x", "m", 3, 32).sampling_parameters == work.sampling_parameters


def test_edit_distance():
    assert edit_distance([], []) == 0
    assert edit_distance(["a", "b"], ["a", "b"]) == 0
    assert edit_distance(["a", "b", "c"], ["a", "x", "c"]) == 1
    assert edit_distance(["a"], []) == 1
    assert edit_distance(["a", "b"], ["b", "a"]) == 2


def test_the_same_build_must_match_token_for_token():
    expected = [" Paris", " is", " the", " capital", "."]
    assert compare(expected, list(expected), same_build=True, tolerance=0.5).passed
    changed = [" Paris", " is", " a", " capital", "."]
    verdict = compare(expected, changed, same_build=True, tolerance=0.5)
    assert not verdict.passed and "token 2 of 5" in verdict.detail
    assert not compare(expected, expected[:-1], same_build=True, tolerance=0.5).passed


@pytest.mark.parametrize(
    "actual, passes",
    [
        ([f" t{i}" for i in range(20)], True),
        ([f" t{i}" for i in range(18)] + [" x", " y"], True),  # drift near the end: 2 of 20 allowed
        ([f" t{i}" for i in range(10)] + [" x"] * 10, False),  # half the answer differs
        ([" another", " model"] * 10, False),
    ],
)
def test_between_builds_an_edit_distance_tolerance_applies(actual, passes):
    expected = [f" t{i}" for i in range(20)]
    assert compare(expected, actual, same_build=False, tolerance=0.1).passed is passes


def test_only_workers_of_one_model_and_revision_are_compared():
    assert A.comparable(A) and A.same_build(A)
    other_build = Identity("m", "org/model", "sha256:1", "version 2, llama.cpp 0.4")
    assert A.comparable(other_build) and not A.same_build(other_build)
    assert not A.comparable(Identity("m", "org/model", "sha256:2", A.build))  # another file
    assert not A.comparable(Identity("m", "org/other", "sha256:1", A.build))
    assert not A.comparable(Identity("n", "org/model", "sha256:1", A.build))
    unknown = Identity("m", None, None, None)
    assert unknown.comparable(unknown) and not unknown.same_build(unknown)  # tolerance, not exactness


def test_who_takes_user_work():
    assert WorkerTrust().may_take_user_work("m", [])
    assert not WorkerTrust().may_take_user_work("m", ["m"])
    assert WorkerTrust(trusted=True).may_take_user_work("m", ["m"])
    assert not WorkerTrust(trusted=True, flagged=True).may_take_user_work("m", [])
    assert not WorkerTrust(flagged=True).may_take_user_work("m", [])


def test_choose_worker_skips_workers_that_take_no_user_work():
    fast_but_flagged = WorkerCapacity("a", declared_slots=4, tokens_per_second=100.0, takes_user_work=False)
    slow = WorkerCapacity("b", declared_slots=1, tokens_per_second=1.0)
    assert choose_worker([fast_but_flagged, slow], 10) is slow
    assert choose_worker([fast_but_flagged], 10) is None


def test_trusted_only_work_goes_to_trusted_workers_only():
    fast_untrusted = WorkerCapacity("a", declared_slots=4, tokens_per_second=100.0)
    slow_trusted = WorkerCapacity("b", declared_slots=1, tokens_per_second=1.0, trusted=True)
    assert choose_worker([fast_untrusted, slow_trusted], 10) is fast_untrusted
    assert choose_worker([fast_untrusted, slow_trusted], 10, trusted_only=True) is slow_trusted
    assert choose_worker([fast_untrusted], 10, trusted_only=True) is None


def test_trusted_only_tiers_must_be_tiers():
    from oasst_inference_server.settings import Settings

    assert Settings(trusted_workers_only_tiers=["priority"]).trusted_workers_only_tiers == ["priority"]
    with pytest.raises(ValueError, match="not in user_tiers: gold"):
        Settings(trusted_workers_only_tiers=["gold"])
