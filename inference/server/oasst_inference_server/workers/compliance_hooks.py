"""What a worker connection does for compliance, behind one interface: check jobs (probes: never stored
as messages, so they reach no user and count in no usage or fair share; on the wire they are plain work),
user jobs drawn for a spot check, and usage a worker bills beyond what the server counted.

The connection calls these hooks from its frame handlers; the checks themselves are
:mod:`.compliance` (the checker), :mod:`.compliance_rules` and :mod:`.compliance_store`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from oasst_inference_server.settings import Settings
from oasst_inference_server.workers.compliance_rules import ProbeOutcome, SpotChecks
from oasst_inference_server.workers.compliance_store import FAILED, CheckResult, ComplianceRecorder
from oasst_inference_server.workers.in_flight import InFlight
from oasst_inference_server.workers.trust import WorkerTrust
from oasst_inference_server.workers.worker_frames import token_cap
from oasst_shared.protocol import GeneratedText, Work
from oasst_shared.token_frames import TokenFrame


@dataclass
class _Probe:
    done: asyncio.Future[ProbeOutcome]
    limit: int  # token frames kept (worker_frames.token_cap)
    tokens: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Checked:
    """Who is checked: the connection's identity as a check result names it."""

    worker_id: str | None
    session_id: str
    model_name: str


class ComplianceHooks:
    def __init__(
        self,
        checked: Checked,
        trust: WorkerTrust,
        settings: Settings,
        recorder: ComplianceRecorder | None,
        spot_checks: SpotChecks | None,
    ) -> None:
        self._checked = checked
        self._trust = trust
        self._settings = settings
        self._recorder = recorder
        self._spot_checks = spot_checks
        # Compliance checks in flight: message id -> the check.
        self._probes: dict[str, _Probe] = {}

    def switched(self, model_name: str) -> None:
        """The worker serves another model now (protocol 6): its checks and flags name that one."""
        self._checked = Checked(self._checked.worker_id, self._checked.session_id, model_name)

    def __len__(self) -> int:
        """Check jobs in flight (each holds a slot)."""
        return len(self._probes)

    # ------------------------------------------------------------ probes
    def open_probe(self, work: Work) -> asyncio.Future[ProbeOutcome]:
        probe = _Probe(asyncio.get_running_loop().create_future(), token_cap(work))
        self._probes[work.message_id] = probe
        return probe.done

    def close_probe(self, message_id: str) -> None:
        self._probes.pop(message_id, None)

    def took_token(self, token: TokenFrame) -> bool:
        """True for a check job's token (kept up to its cap, never relayed)."""
        probe = self._probes.get(token.message_id)
        if probe is None:
            return False
        if len(probe.tokens) < probe.limit:
            probe.tokens.append(token.text)
        return True

    async def took_answer(self, frame: GeneratedText) -> bool:
        """True for a check job's answer: its usage checked and the check given its outcome."""
        probe = self._probes.get(frame.message_id)
        if probe is None:
            return False
        await self.check_usage(frame, frame.model_copy(update={"generated_tokens": len(probe.tokens)}))
        self._finish(
            frame.message_id,
            ProbeOutcome(probe.tokens, "".join(probe.tokens), frame.generated_tokens, "answered"),
        )
        return True

    def took_error(self, message_id: str, error: str) -> bool:
        """True for a check job's error: the check is inconclusive (an honest worker may fail)."""
        if message_id not in self._probes:
            return False
        self._finish(message_id, ProbeOutcome(None, "", 0, f"the worker failed: {error}"))
        return True

    def disconnected(self) -> None:
        for message_id in list(self._probes):
            self._finish(message_id, ProbeOutcome(None, "", 0, "the worker disconnected"))

    def _finish(self, message_id: str, outcome: ProbeOutcome) -> None:
        probe = self._probes.get(message_id)
        if probe is not None and not probe.done.done():
            probe.done.set_result(outcome)

    # ------------------------------------------------------------ user jobs
    def spot_checked(self, work: Work) -> bool:
        """Whether to keep this user job's tokens for a spot check (untrusted workers only)."""
        return self._spot_checks is not None and not self._trust.trusted and self._spot_checks.wants(work)

    def finished(self, connection: object, record: InFlight, frame: GeneratedText) -> None:
        """A user job ended: a spot-checked one that ran to a natural end is replayed and compared."""
        if record.spot_tokens is None or record.work is None or self._spot_checks is None:
            return
        if frame.finish_reason in ("length", "eos_token", "stop_sequence"):
            self._spot_checks.spot_check(connection, record.work, list(record.spot_tokens))

    async def check_usage(self, claimed: GeneratedText, counted: GeneratedText) -> None:
        """A worker that bills far more tokens than the server counted fails a compliance check (the
        usage stored is the server's bound in any case)."""
        excess = claimed.generated_tokens - counted.generated_tokens
        if self._recorder is None or excess <= self._settings.usage_overclaim_tokens:
            return
        await self._recorder.record(
            CheckResult(
                worker_id=self._checked.worker_id,
                session_id=self._checked.session_id,
                model_config_name=self._checked.model_name,
                kind="usage",
                outcome=FAILED,
                detail=f"claimed {claimed.generated_tokens} generated tokens of message "
                f"{claimed.message_id}; the server counted at most {counted.generated_tokens}",
            )
        )
