"""The compliance checker with stand-in connections: who is checked, against whom, what is kept, and
which outcomes count."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from oasst_inference_server.scheduling.capacity import WorkerCapacity
from oasst_inference_server.settings import Settings
from oasst_inference_server.workers.compliance import ComplianceChecker
from oasst_inference_server.workers.compliance_rules import ProbeOutcome, check_work
from oasst_inference_server.workers.compliance_store import CheckResult
from oasst_inference_server.workers.trust import WorkerTrust
from oasst_shared.model_configs import SMOLLM2_135M
from oasst_shared.protocol import Work, WorkerInfo


@dataclass
class StubConnection:
    session_id: str
    info: WorkerInfo
    trust: WorkerTrust
    answer: list[str] | None  # None: the job times out
    worker_id: str | None = None
    capacity: WorkerCapacity = field(default_factory=lambda: WorkerCapacity("x", declared_slots=2))
    jobs: list[Work] = field(default_factory=list)

    async def probe(self, work: Work, timeout: float) -> ProbeOutcome:
        self.jobs.append(work)
        if self.answer is None:
            return ProbeOutcome(None, "", 0, "no answer within 1s")
        return ProbeOutcome(self.answer, "".join(self.answer), len(self.answer), "answered")


@dataclass
class StubDispatcher:
    workers: dict[str, StubConnection]


@dataclass
class StubDispatchers:
    by_model: dict[str, StubDispatcher]


@dataclass
class StubRecorder:
    results: list[CheckResult] = field(default_factory=list)

    async def record(self, result: CheckResult) -> bool:
        self.results.append(result)
        return False


def _info(revision: str = "sha256:1", build: str = "b1") -> WorkerInfo:
    return WorkerInfo(
        model_config=SMOLLM2_135M,
        max_parallel_requests=2,
        backend_kind="tgi",
        backend_model_id="org/m",
        backend_model_revision=revision,
        backend_version=build,
    )


def _checker(*connections: StubConnection) -> tuple[ComplianceChecker, StubRecorder]:
    settings = Settings(compliance_check_interval=1.0, database_url="sqlite+aiosqlite://")
    dispatchers = StubDispatchers({SMOLLM2_135M.name: StubDispatcher({c.session_id: c for c in connections})})
    recorder = StubRecorder()
    return ComplianceChecker(settings, dispatchers, recorder), recorder  # type: ignore[arg-type]


_clock = [0.0]


async def _run_checks(checker: ComplianceChecker) -> None:
    """One round: every worker's check is due (a worker seen the first time is only scheduled)."""
    for _ in range(2):
        _clock[0] += 10.0  # past every due time (interval 1 s, jitter at most 1.5 s)
        checker.start_due_checks(_clock[0])
    await asyncio.sleep(0)
    while checker._running:
        await asyncio.sleep(0.01)


ANSWER = [" Paris", " is", " the", " capital", "."]


async def test_untrusted_workers_are_checked_against_a_trusted_answer_and_trusted_ones_never():
    trusted = StubConnection("t", _info(), WorkerTrust(trusted=True), ANSWER)
    honest = StubConnection("h", _info(), WorkerTrust(), ANSWER)
    liar = StubConnection("l", _info(), WorkerTrust(), [" Paris", " is", " a", " capital", "."])
    flagged = StubConnection("f", _info(), WorkerTrust(flagged=True), ANSWER)
    checker, recorder = _checker(trusted, honest, liar, flagged)
    await _run_checks(checker)
    outcomes = {r.session_id: r.outcome for r in recorder.results}
    assert outcomes == {"h": "passed", "l": "failed"}  # the trusted and the flagged are not checked
    failed = next(r for r in recorder.results if r.session_id == "l")
    assert failed.reference_session_id == "t" and "token 2" in failed.detail
    assert (failed.expected_text, failed.actual_text) == ("".join(ANSWER), " Paris is a capital.")
    passed = next(r for r in recorder.results if r.session_id == "h")
    assert (passed.expected_text, passed.actual_text) == (None, None)  # texts only as evidence
    assert flagged.jobs == [] and len(trusted.jobs) == 2
    # The trusted worker answered the same job at the same time, save the message id.
    checked = liar.jobs[0]
    reference = next(j for j in trusted.jobs if j.thread == checked.thread)
    assert reference.message_id != checked.message_id
    assert reference.model_dump(exclude={"message_id"}) == checked.model_dump(exclude={"message_id"})


async def test_a_kept_answer_is_reused_and_a_timeout_is_inconclusive():
    trusted = StubConnection("t", _info(), WorkerTrust(trusted=True), ANSWER)
    slow = StubConnection("s", _info(), WorkerTrust(), None)
    checker, recorder = _checker(trusted, slow)
    for _ in range(20):
        await _run_checks(checker)
    assert {r.outcome for r in recorder.results} == {"inconclusive"}
    assert all("no answer" in r.detail for r in recorder.results)
    # 16 prompts: each answered once by the trusted worker, then kept.
    assert len(trusted.jobs) <= 16 < len(slow.jobs)


async def test_another_model_file_is_held_to_the_tolerance_and_no_trusted_worker_means_no_check():
    answer = ANSWER * 4
    trusted = StubConnection("t", _info(), WorkerTrust(trusted=True), answer)
    other_file = StubConnection("o", _info(revision="sha256:2"), WorkerTrust(), [" Lyon"] * 20)
    close_build = StubConnection("c", _info(build="b2"), WorkerTrust(), [*answer[:-1], "!"])
    checker, recorder = _checker(trusted, other_file, close_build)
    await _run_checks(checker)
    outcomes = {r.session_id: r.outcome for r in recorder.results}
    # Another build drifts by one token of 20 (within the default 10%); another file differs throughout.
    assert outcomes == {"o": "failed", "c": "passed"}
    lonely, recorder2 = _checker(StubConnection("u", _info(), WorkerTrust(), ANSWER))
    await _run_checks(lonely)
    assert recorder2.results == []


async def test_spot_checks_replay_greedy_user_jobs_on_a_trusted_worker():
    trusted = StubConnection("t", _info(), WorkerTrust(trusted=True), ANSWER)
    checked = StubConnection("u", _info(), WorkerTrust(), ANSWER)
    checker, recorder = _checker(trusted, checked)
    greedy = check_work("user-message-1", SMOLLM2_135M.name, 0, 16)
    sampled = greedy.model_copy(
        update={
            "sampling_parameters": greedy.sampling_parameters.model_copy(
                update={"do_sample": True, "temperature": 0.7}
            )
        }
    )
    assert not checker.wants(greedy)  # off by default
    checker._settings = checker._settings.model_copy(update={"compliance_spot_check_fraction": 1.0})
    assert checker.wants(greedy) and not checker.wants(sampled)

    checker.spot_check(checked, greedy, list(ANSWER))
    checker.spot_check(checked, greedy, [" Paris", " is", " lovely", "."])
    while checker._spot_tasks:
        await asyncio.sleep(0.01)
    passed, failed = sorted(recorder.results, key=lambda r: r.outcome != "passed")
    assert (passed.outcome, passed.kind, passed.expected_text, passed.actual_text) == (
        "passed",
        "spot",
        None,
        None,
    )
    assert (failed.outcome, failed.kind) == ("failed", "spot")
    assert failed.actual_text == " Paris is lovely." and failed.expected_text == "".join(ANSWER)
    # The trusted worker ran the user's job itself under another message id.
    assert [j.thread for j in trusted.jobs] == [greedy.thread, greedy.thread]
    assert all(j.message_id != greedy.message_id for j in trusted.jobs)


class _Dispatcher:
    def __init__(self) -> None:
        self.changes = 0

    def capacity_changed(self) -> None:
        self.changes += 1


def _connection(settings: Settings, trust: WorkerTrust):  # type: ignore[no-untyped-def]
    from oasst_inference_server.workers.worker_connection import WorkerConnection

    return WorkerConnection(
        None,  # type: ignore[arg-type]  # never touched before run()
        _info(),
        settings=settings,
        broker=None,  # type: ignore[arg-type]
        lifecycle=None,  # type: ignore[arg-type]
        dispatcher=_Dispatcher(),  # type: ignore[arg-type]
        trust=trust,
    )


async def test_a_connection_takes_user_work_as_its_trust_and_the_settings_say():
    free = Settings(database_url="sqlite+aiosqlite://")
    guarded = Settings(database_url="sqlite+aiosqlite://", trusted_workers_only_models=[SMOLLM2_135M.name])
    assert _connection(free, WorkerTrust()).capacity.takes_user_work
    assert not _connection(guarded, WorkerTrust()).capacity.takes_user_work
    trusted = _connection(guarded, WorkerTrust(trusted=True))
    assert trusted.capacity.takes_user_work and trusted.capacity.trusted
    assert not _connection(free, WorkerTrust(flagged=True)).capacity.takes_user_work
    # Flagging a live connection (the broker command of compliance_store) stops its user work at once.
    live = _connection(free, WorkerTrust())
    live._publish_session = _nothing  # type: ignore[method-assign]
    await live.flag("3 failed compliance checks")
    assert not live.capacity.takes_user_work and live.trust.flag_reason == "3 failed compliance checks"


async def _nothing() -> None:
    return None
