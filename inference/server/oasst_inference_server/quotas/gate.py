"""Admission against the limits of the caller's API key and of its user: the model allow-list (403), then
requests per minute (counted here, atomically with the checks), tokens per minute and budgets (charged
when generations end, :mod:`.charging`) in one broker step. Refusals are ``RateLimited`` with the limit's
name as the code (``key_requests_per_minute``, ``user_budget_exceeded``...) and when to retry."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.broker import Broker
from oasst_inference_server.broker.counters import CounterCheck, CounterRefusal
from oasst_inference_server.db.models import utcnow
from oasst_inference_server.domain_errors import InvalidRequest, NotPermitted, RateLimited
from oasst_inference_server.quotas import periods
from oasst_inference_server.quotas.limits_store import limits_of
from oasst_inference_server.quotas.periods import MINUTE, SubjectKind
from oasst_inference_server.quotas.prices import MICRO, Prices
from oasst_inference_server.quotas.usage_rows import subject_usage_since
from oasst_shared.usage_limits import BudgetPeriod, UsageLimits

_WHO = {"key": "this API key", "user": "your account"}
_SEED_ATTEMPTS = 3  # a counter rebuilt from the database is found at the next check


@dataclass(frozen=True)
class _Meaning:
    """What a check stands for, to word its refusal (or rebuild its counter)."""

    kind: SubjectKind
    subject: str
    limit: str  # "requests_per_minute" | "tokens_per_minute" | "budget_tokens" | "budget_usd"
    period: BudgetPeriod | None = None


def allowed_models(key: UsageLimits | None, user: UsageLimits | None) -> set[str] | None:
    """The models both the key's and the user's allow-lists allow; None: every model."""
    lists = [
        set(limits.allowed_models) for limits in (key, user) if limits and limits.allowed_models is not None
    ]
    if not lists:
        return None
    return set.intersection(*lists)


class QuotaGate:
    def __init__(self, broker: Broker, prices: Prices) -> None:
        self._broker = broker
        self.prices = prices

    async def allowed_models(
        self, session: AsyncSession, user_id: str, api_key_id: str | None
    ) -> set[str] | None:
        return allowed_models(*await limits_of(session, user_id, api_key_id))

    async def admit(
        self,
        session: AsyncSession,
        user_id: str,
        api_key_id: str | None,
        model: str,
        count: int = 1,
        *,
        counted: bool = True,
    ) -> None:
        """Refuse (403 ``model_not_allowed``, 429 with the limit's code) or count ``count`` requests
        (``counted`` false: only refuse, counting nothing: a look ahead of admission)."""
        key_limits, user_limits = await limits_of(session, user_id, api_key_id)
        subjects: list[tuple[SubjectKind, str, UsageLimits]] = []
        if key_limits is not None and api_key_id is not None:
            subjects.append(("key", api_key_id, key_limits))
        if user_limits is not None:
            subjects.append(("user", user_id, user_limits))
        if not subjects:
            return
        for kind, _, limits in subjects:
            if limits.allowed_models is not None and model not in limits.allowed_models:
                allowed = ", ".join(limits.allowed_models) or "none"
                raise NotPermitted(
                    "model_not_allowed",
                    f"{_WHO[kind]} may not use the model {model!r}; it may use: {allowed}",
                    param="model",
                )
        now = utcnow()
        checks: list[CounterCheck] = []
        meanings: list[_Meaning] = []
        for kind, subject, limits in subjects:
            for check, meaning in _checks(kind, subject, limits, count if counted else 0, now):
                checks.append(check)
                meanings.append(meaning)
        for _ in range(_SEED_ATTEMPTS):
            refusal = await self._broker.check_counters(checks)
            if refusal is None:
                return
            meaning = meanings[refusal.position]
            if refusal.missing:
                await self._rebuild(session, meaning, now)
                continue
            raise _refused(meaning, checks[refusal.position], refusal, count, now)
        raise RateLimited(
            "usage_unavailable", "usage counters are being rebuilt: retry shortly", retry_after=1
        )

    async def _rebuild(self, session: AsyncSession, meaning: _Meaning, now: datetime) -> None:
        """Set the period's budget counters from the database (what the broker lost, or never had)."""
        assert meaning.period is not None
        since = periods.period_start(meaning.period, now)
        tokens, micro = await subject_usage_since(session, meaning.kind, meaning.subject, since, self.prices)
        ttl = periods.counter_ttl(meaning.period, now)
        await self._broker.seed_counter(
            periods.budget_tokens_counter(meaning.kind, meaning.subject, meaning.period, now), tokens, ttl
        )
        await self._broker.seed_counter(
            periods.budget_usd_counter(meaning.kind, meaning.subject, meaning.period, now), micro, ttl
        )


def _checks(
    kind: SubjectKind, subject: str, limits: UsageLimits, count: int, now: datetime
) -> list[tuple[CounterCheck, _Meaning]]:
    found: list[tuple[CounterCheck, _Meaning]] = []
    if limits.requests_per_minute is not None:
        found.append(
            (
                CounterCheck(
                    periods.requests_counter(kind, subject),
                    limits.requests_per_minute,
                    need=count,
                    window=MINUTE,
                ),
                _Meaning(kind, subject, "requests_per_minute"),
            )
        )
    if limits.tokens_per_minute is not None:
        found.append(
            (
                CounterCheck(periods.tokens_counter(kind, subject), limits.tokens_per_minute, window=MINUTE),
                _Meaning(kind, subject, "tokens_per_minute"),
            )
        )
    period = limits.budget_period
    if period is not None:
        ttl = periods.counter_ttl(period, now)
        if limits.budget_tokens is not None:
            name = periods.budget_tokens_counter(kind, subject, period, now)
            found.append(
                (
                    CounterCheck(name, limits.budget_tokens, ttl=ttl, seeded=True),
                    _Meaning(kind, subject, "budget_tokens", period),
                )
            )
        if limits.budget_usd is not None:
            name = periods.budget_usd_counter(kind, subject, period, now)
            found.append(
                (
                    CounterCheck(name, max(1, round(limits.budget_usd * MICRO)), ttl=ttl, seeded=True),
                    _Meaning(kind, subject, "budget_usd", period),
                )
            )
    return found


def _refused(
    meaning: _Meaning, check: CounterCheck, refusal: CounterRefusal, count: int, now: datetime
) -> InvalidRequest | RateLimited:
    who, kind = _WHO[meaning.kind], meaning.kind
    if meaning.limit == "requests_per_minute":
        if refusal.retry_after is None:  # the request alone starts more than the limit allows
            return InvalidRequest(
                "too_many_choices",
                f"the request starts {count} generations; {who} may start {check.limit} per minute",
                param="n",
            )
        return RateLimited(
            f"{kind}_requests_per_minute",
            f"{who} reached its limit of {check.limit} requests per minute ({kind}_requests_per_minute); "
            f"retry in {refusal.retry_after}s",
            retry_after=refusal.retry_after,
        )
    if meaning.limit == "tokens_per_minute":
        retry = refusal.retry_after or MINUTE
        return RateLimited(
            f"{kind}_tokens_per_minute",
            f"{who} used {refusal.used} tokens in the last minute, its limit is {check.limit} "
            f"({kind}_tokens_per_minute); retry in {retry}s",
            retry_after=retry,
        )
    assert meaning.period is not None
    renews = periods.seconds_left(meaning.period, now)
    if meaning.limit == "budget_tokens":
        spent = f"{refusal.used} of its {check.limit} tokens"
    else:
        spent = f"${refusal.used / MICRO:.6f} of its ${check.limit / MICRO:.2f}"
    return RateLimited(
        f"{kind}_budget_exceeded",
        f"{who} has used {spent} budget for this {meaning.period} (UTC) ({kind}_budget_exceeded); "
        f"it renews in {renews}s",
        retry_after=renews,
    )
