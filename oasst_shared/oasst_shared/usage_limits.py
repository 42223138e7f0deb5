"""Usage limits of an API key or a user, and the admin API's views of keys and usage (``/admin/keys``,
``/admin/usage``): the wire models the server, the admin CLI and the admin page share."""

from __future__ import annotations

from datetime import date, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

BudgetPeriod = Literal["day", "month"]
MAX_ALLOWED_MODELS = 256
MAX_REQUESTS_PER_MINUTE = 1_000_000
MAX_TOKENS_PER_MINUTE = 1_000_000_000
MAX_BUDGET_TOKENS = 10**15
MAX_BUDGET_USD = 10_000_000.0


class UsageLimits(BaseModel):
    """What a key or a user may use; null: no limit of that kind. A key's requests count against both its
    own limits and its user's. Budgets count prompt plus completion tokens (``budget_tokens``) or their
    price (``budget_usd``, from the model configs' prices) per calendar ``budget_period`` in UTC."""

    model_config = ConfigDict(extra="forbid")

    requests_per_minute: int | None = Field(None, ge=1, le=MAX_REQUESTS_PER_MINUTE)
    tokens_per_minute: int | None = Field(None, ge=1, le=MAX_TOKENS_PER_MINUTE)
    budget_tokens: int | None = Field(None, ge=1, le=MAX_BUDGET_TOKENS)
    budget_usd: float | None = Field(None, gt=0, le=MAX_BUDGET_USD)
    budget_period: BudgetPeriod | None = None
    allowed_models: list[str] | None = Field(None, max_length=MAX_ALLOWED_MODELS)

    @field_validator("allowed_models")
    @classmethod
    def _model_names(cls, names: list[str] | None) -> list[str] | None:
        if names is None:
            return None
        for name in names:
            if not name or len(name) > 128:
                raise ValueError("each model name has 1 to 128 characters")
        return sorted(set(names))

    @model_validator(mode="after")
    def _budget_has_a_period(self) -> UsageLimits:
        if (self.budget_tokens is not None or self.budget_usd is not None) and self.budget_period is None:
            raise ValueError("a budget needs budget_period: 'day' or 'month'")
        return self

    @property
    def is_empty(self) -> bool:
        return self == UsageLimits()


class KeyUsageSummary(BaseModel):
    """A key's usage: today's (UTC) requests and tokens, and what it spent in its budget's period (the
    current month when it has no budget)."""

    requests_today: int = 0
    tokens_today: int = 0
    spent_usd_period: float = 0.0


class AdminKeyRead(BaseModel):
    id: str
    user_id: str
    name: str
    prefix: str
    revoked_at: datetime | None = None
    limits: UsageLimits
    usage: KeyUsageSummary


class UserLimitsRead(BaseModel):
    user_id: str
    limits: UsageLimits


class UsageRow(BaseModel):
    """Generations of one key (null: without a key) and model on one day (UTC), by when they were queued."""

    day: date
    user_id: str | None
    key_id: str | None
    model: str | None
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
