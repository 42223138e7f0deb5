"""Budget periods (calendar days and months in UTC) and the broker counters' names."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Literal

from oasst_shared.usage_limits import BudgetPeriod

SubjectKind = Literal["key", "user"]
MINUTE = 60
PERIODS: tuple[BudgetPeriod, ...] = ("day", "month")
# A period's counters outlive it by this much (a late charge of the last day still finds its counter).
_GRACE = timedelta(days=2)
# How long a generation's "charged" marker keeps a second charge out. The database already lets a
# generation end (and so be charged) once: its end is a conditional update, a late prompt report is kept
# only if it has none. The marker covers what is left, seconds apart: the charge's script sent again by
# redis-py's retry after a lost connection, two late reports at once. An hour of markers, not 40 days' of
# every generation's.
CHARGED_MARKER_SECONDS = 3600


def period_start(period: BudgetPeriod, now: datetime) -> datetime:
    now = now.astimezone(timezone.utc)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return day if period == "day" else day.replace(day=1)


def period_end(period: BudgetPeriod, now: datetime) -> datetime:
    start = period_start(period, now)
    if period == "day":
        return start + timedelta(days=1)
    return (start + timedelta(days=32)).replace(day=1)


def period_id(period: BudgetPeriod, now: datetime) -> str:
    start = period_start(period, now)
    return start.strftime("%Y-%m-%d" if period == "day" else "%Y-%m")


def seconds_left(period: BudgetPeriod, now: datetime) -> int:
    return max(1, int((period_end(period, now) - now).total_seconds()) + 1)


def counter_ttl(period: BudgetPeriod, now: datetime) -> int:
    return int((period_end(period, now) + _GRACE - now).total_seconds())


def requests_counter(kind: SubjectKind, subject: str) -> str:
    return f"rpm:{kind}:{subject}"


def tokens_counter(kind: SubjectKind, subject: str) -> str:
    return f"tpm:{kind}:{subject}"


def budget_tokens_counter(kind: SubjectKind, subject: str, period: BudgetPeriod, now: datetime) -> str:
    return f"budget_tokens:{kind}:{subject}:{period_id(period, now)}"


def budget_usd_counter(kind: SubjectKind, subject: str, period: BudgetPeriod, now: datetime) -> str:
    """In micro-dollars (a whole number)."""
    return f"budget_usd:{kind}:{subject}:{period_id(period, now)}"


def charged_marker(message_id: str) -> str:
    return f"charged:{message_id}"
