"""Compliance checks of untrusted workers: one checker per replica, for the workers of its sockets.

Every ``settings.compliance_check_interval`` seconds (each worker on its own schedule, with jitter) an
untrusted, unflagged worker with a free slot gets a check: a greedy job (:mod:`.compliance_rules`) sent as
ordinary work. Its expected answer comes from a trusted worker of the same model config, one of a
comparable identity (model id and revision as the workers reported them) where there is one: computed
once per prompt and identity and kept, or, the first time, computed by the trusted worker at the same
time. A worker whose model file or revision no trusted worker shares is compared with the tolerance
between builds (it serves the model config under another file: a cheaper quantization, another model). The answers are compared token
by token (:func:`.compliance_rules.compare`) and the result is recorded (:mod:`.compliance_store`), which
flags the worker past ``settings.compliance_fail_threshold`` failures.

A check whose job times out, fails at the worker (its backend down, no room) or loses the socket is
*inconclusive*: recorded, never counted as a failure. Check jobs are not messages: they reach no user,
and count in no usage, rate limit or fair share.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import time
import uuid
from collections.abc import Iterable
from dataclasses import replace
from typing import Protocol, cast

from loguru import logger

from oasst_inference_server.scheduling.capacity import WorkerCapacity
from oasst_inference_server.scheduling.dispatcher import Dispatchers
from oasst_inference_server.settings import Settings
from oasst_inference_server.workers.compliance_rules import (
    CHECK_PROMPTS,
    Identity,
    ProbeOutcome,
    check_work,
    compare,
)
from oasst_inference_server.workers.compliance_store import (
    FAILED,
    INCONCLUSIVE,
    PASSED,
    CheckResult,
    ComplianceRecorder,
)
from oasst_inference_server.workers.trust import WorkerTrust
from oasst_shared.protocol import Work, WorkerInfo


class Checkable(Protocol):
    """What the checker needs of a worker connection (``worker_connection.WorkerConnection``)."""

    session_id: str
    worker_id: str | None
    info: WorkerInfo
    trust: WorkerTrust
    capacity: WorkerCapacity

    async def probe(self, work: Work, timeout: float) -> ProbeOutcome: ...


def identity(connection: Checkable) -> Identity:
    info = connection.info
    return Identity(
        info.model_config_.name, info.backend_model_id, info.backend_model_revision, info.backend_version
    )


class ComplianceChecker:
    def __init__(self, settings: Settings, dispatchers: Dispatchers, recorder: ComplianceRecorder) -> None:
        self._settings = settings
        self._dispatchers = dispatchers
        self._recorder = recorder
        self._next_check: dict[str, float] = {}  # session id -> when its next check is due
        self._running: dict[str, asyncio.Task[None]] = {}
        # (identity of the reference, prompt index) -> the trusted answer's tokens and reference session
        self._expected: dict[tuple[Identity, int], tuple[list[str], str]] = {}
        self._prompt_index = random.randrange(len(CHECK_PROMPTS))
        self._spot_tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        interval = self._settings.compliance_check_interval
        if interval <= 0:
            try:
                await asyncio.Event().wait()  # spot checks may still run; cancelled at shutdown
            finally:
                for task in self._spot_tasks:
                    task.cancel()
            return
        tick = min(1.0, interval / 4)
        try:
            while True:
                await asyncio.sleep(tick)
                try:
                    self.start_due_checks(time.monotonic())
                except Exception as exc:  # a bug here must not stop checking for good
                    logger.opt(exception=exc).error("compliance checker pass failed")
        finally:
            tasks = [*self._running.values(), *self._spot_tasks]
            for task in tasks:
                task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.gather(*tasks, return_exceptions=True)

    def _connections(self) -> Iterable[list[Checkable]]:
        for dispatcher in list(self._dispatchers.by_model.values()):
            yield [cast(Checkable, c) for c in dispatcher.workers.values() if hasattr(c, "probe")]

    def start_due_checks(self, now: float) -> None:
        interval = self._settings.compliance_check_interval
        live: set[str] = set()
        for connections in self._connections():
            trusted = [c for c in connections if c.trust.trusted and not c.trust.flagged]
            for connection in connections:
                live.add(connection.session_id)
                if connection.trust.trusted or connection.trust.flagged:
                    continue
                if connection.session_id in self._running:
                    continue
                due = self._next_check.setdefault(connection.session_id, now + random.uniform(0, interval))
                if now < due or connection.capacity.free_slots <= 0:
                    continue
                task = asyncio.create_task(
                    self._check(connection, trusted), name=f"compliance {connection.session_id}"
                )
                self._running[connection.session_id] = task
                task.add_done_callback(functools.partial(self._finished, connection.session_id))
                # Jitter: checks of one worker come at no fixed rhythm it could learn.
                self._next_check[connection.session_id] = now + interval * random.uniform(0.5, 1.5)
        for session_id in set(self._next_check) - live:
            self._next_check.pop(session_id, None)

    def _finished(self, session_id: str, _: asyncio.Task[None]) -> None:
        self._running.pop(session_id, None)

    # ------------------------------------------------------------ spot checks of real traffic
    def wants(self, work: Work) -> bool:
        """Draw a greedy user job for a spot check (sampled answers cannot be compared token by token)."""
        fraction = self._settings.compliance_spot_check_fraction
        return fraction > 0 and work.sampling_parameters.is_greedy and random.random() < fraction

    def spot_check(self, connection: object, work: Work, tokens: list[str]) -> None:
        """Replay a finished user job on a trusted worker and compare, after the fact (in a task)."""
        checked = cast(Checkable, connection)
        task = asyncio.create_task(self._spot_check(checked, work, tokens), name="spot check")
        self._spot_tasks.add(task)
        task.add_done_callback(self._spot_tasks.discard)

    async def _spot_check(self, connection: Checkable, work: Work, tokens: list[str]) -> None:
        me = identity(connection)
        dispatcher = self._dispatchers.by_model.get(me.model_config_name)
        if dispatcher is None:
            return
        workers = [cast(Checkable, c) for c in dispatcher.workers.values() if hasattr(c, "probe")]
        trusted = [c for c in workers if c.trust.trusted and not c.trust.flagged]
        references = [t for t in trusted if identity(t).comparable(me)] or trusted
        source = next((t for t in references if t.capacity.free_slots > 0), None)
        if source is None:
            return  # no trusted room now: this job goes unchecked (spot checks are a sample)
        replay = work.model_copy(update={"message_id": str(uuid.uuid4()), "attempt": 1})
        expected = await source.probe(replay, self._settings.compliance_check_timeout)
        result = CheckResult(
            worker_id=connection.worker_id,
            session_id=connection.session_id,
            model_config_name=me.model_config_name,
            kind="spot",
            outcome=INCONCLUSIVE,
            detail="",
            reference_session_id=source.session_id,
        )
        if expected.tokens is None:
            await self._recorder.record(
                _with(result, INCONCLUSIVE, f"the trusted worker gave no answer: {expected.detail}")
            )
            return
        verdict = compare(
            expected.tokens,
            tokens,
            same_build=identity(source).same_build(me),
            tolerance=self._settings.compliance_tolerance,
        )
        if verdict.passed:
            await self._recorder.record(_with(result, PASSED, verdict.detail))
            return
        # Only a failure keeps the user's texts: the operator needs the evidence.
        await self._recorder.record(
            replace(
                result,
                outcome=FAILED,
                detail=verdict.detail,
                expected_text=expected.text,
                actual_text="".join(tokens),
            )
        )

    async def _check(self, connection: Checkable, trusted: list[Checkable]) -> None:
        me = identity(connection)
        references = [t for t in trusted if identity(t).comparable(me)]
        if not references:
            # Another model file or revision under the same model config (a cheaper quantization, another
            # model): it answers for that config, so it is held to a trusted worker's answers with the
            # tolerance between builds.
            references = list(trusted)
        if not references:
            logger.debug(
                "no trusted worker of {}: {} not checked", me.model_config_name, connection.session_id
            )
            return
        self._prompt_index += 1
        index = self._prompt_index % len(CHECK_PROMPTS)
        reference = self._expected_for(references, me, index)
        settings = self._settings
        model = me.model_config_name

        def job() -> Work:
            return check_work(str(uuid.uuid4()), model, index, settings.compliance_check_max_new_tokens)

        if reference is not None:
            expected_tokens, reference_session, same_build = reference
            outcome = await connection.probe(job(), settings.compliance_check_timeout)
            expected = ProbeOutcome(expected_tokens, "".join(expected_tokens), len(expected_tokens), "kept")
        else:
            # No kept answer: a trusted worker with room answers the same job at the same time.
            source = next((t for t in references if t.capacity.free_slots > 0), None)
            if source is None:
                return  # every comparable trusted worker is busy: try again next time
            expected, outcome = await asyncio.gather(
                source.probe(job(), settings.compliance_check_timeout),
                connection.probe(job(), settings.compliance_check_timeout),
            )
            reference_session, same_build = source.session_id, identity(source).same_build(me)
            if expected.tokens is not None:
                self._expected[(identity(source), index)] = (expected.tokens, source.session_id)
        result = CheckResult(
            worker_id=connection.worker_id,
            session_id=connection.session_id,
            model_config_name=model,
            kind="output",
            outcome=INCONCLUSIVE,
            detail="",
            reference_session_id=reference_session,
            prompt=CHECK_PROMPTS[index],
            expected_text=expected.text,
            actual_text=outcome.text,
        )
        if expected.tokens is None:
            result = _with(result, INCONCLUSIVE, f"the trusted worker gave no answer: {expected.detail}")
        elif outcome.tokens is None:
            result = _with(result, INCONCLUSIVE, outcome.detail)
        else:
            verdict = compare(
                expected.tokens,
                outcome.tokens,
                same_build=same_build,
                tolerance=settings.compliance_tolerance,
            )
            result = _with(result, PASSED if verdict.passed else FAILED, verdict.detail)
        if result.outcome != FAILED:
            # Both answers are kept as evidence of a mismatch only: the table grows by checks.
            result = replace(result, expected_text=None, actual_text=None)
        await self._recorder.record(result)

    def _expected_for(
        self, references: list[Checkable], me: Identity, index: int
    ) -> tuple[list[str], str, bool] | None:
        """A kept trusted answer for this prompt, preferring one of the same build."""
        ranked = sorted(references, key=lambda t: not identity(t).same_build(me))
        for reference in ranked:
            kept = self._expected.get((identity(reference), index))
            if kept is not None:
                return kept[0], kept[1], identity(reference).same_build(me)
        return None


def _with(result: CheckResult, outcome: str, detail: str) -> CheckResult:
    return replace(result, outcome=outcome, detail=detail)
