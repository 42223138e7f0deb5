"""Settings sections: scheduling, the rebalancer, per-user limits and the OpenAI API."""

from __future__ import annotations

from pydantic import BaseModel, Field, NonNegativeInt, model_validator


class _SchedulingSettings(BaseModel):
    """Settings: scheduling."""

    fair_queuing: bool = Field(
        default=True,
        description="Serve waiting users by least tokens received; off: one first-come-first-served queue",
    )
    fair_queue_credit_tokens: float = Field(
        default=256.0,
        ge=0,
        description="Tokens of service a user returning from idle may get ahead of those already waiting",
    )
    fair_queue_prompt_token_weight: float = Field(
        default=1.0, ge=0, description="What a prompt token counts in a user's fair share"
    )
    fair_queue_generated_token_weight: float = Field(
        default=1.0, ge=0, description="What a generated token counts in a user's fair share"
    )
    user_tiers: dict[str, float] = Field(
        default_factory=lambda: {"low": 0.5, "standard": 1.0, "priority": 2.0},
        description="Tier name -> weight: a user of weight 2 gets twice the tokens of weight 1 under load",
    )
    default_user_tier: str = Field(default="standard", description="The tier of users not given one")
    max_request_priority: int = Field(
        default=2,
        ge=0,
        le=8,
        description="Trusted clients may pass a priority in [-this, this]; each step doubles the weight",
    )
    queue_timeout: float = Field(
        default=600.0, gt=0, description="Seconds a message may wait in the queue before it fails"
    )
    affinity: bool = Field(
        default=True,
        description="Send a conversation's next turn to the worker that answered its previous one (its "
        "backend may still hold the conversation in its prefix cache), unless another finishes it sooner",
    )


class _RebalancerSettings(BaseModel):
    """Settings: the rebalancer (docs/scheduling.md): one replica at a time moves switchable workers from
    over-served models to starved ones."""

    rebalance_interval: float = Field(
        default=10.0,
        ge=0,
        description="Seconds between rebalancing rounds (on one replica at a time); 0 turns the rebalancer off",
    )
    rebalancer_min_workers: dict[str, NonNegativeInt] = Field(
        default_factory=dict,
        description="Model config name -> the fewest workers it keeps (restored first when it has fewer), "
        'e.g. {"smollm2-135m": 1}; models not named get rebalancer_default_min_workers',
    )
    rebalancer_max_workers: dict[str, NonNegativeInt] = Field(
        default_factory=dict,
        description="Model config name -> the most workers it may have (above it, one is unloaded a round); "
        "models not named have no maximum",
    )
    rebalancer_default_min_workers: int = Field(
        default=0, ge=0, le=100_000, description="The minimum of a model not in rebalancer_min_workers"
    )
    rebalancer_cooldown: float = Field(
        default=120.0,
        ge=0,
        description="Seconds a moved worker stays on its new model before it may move again",
    )
    rebalancer_max_moves: int = Field(
        default=10,
        ge=1,
        le=10_000,
        description="The most workers one round moves, or rebalancer_max_moves_share of the switchable "
        "workers where that is more",
    )
    rebalancer_max_moves_share: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="The share of the switchable workers one round may move (5 %: 50 of 1,000), where "
        "more than rebalancer_max_moves",
    )
    rebalancer_starved_utilization: float = Field(
        default=1.0,
        gt=0,
        le=10,
        description="A model whose load (slots its traffic and queue need) is above this share of its "
        "workers' slots is starved and may receive a worker",
    )
    rebalancer_donor_utilization: float = Field(
        default=0.7,
        gt=0,
        le=10,
        description="A model gives a worker only if its load stays at or below this share of the slots it "
        "keeps (below rebalancer_starved_utilization: the gap is the hysteresis that keeps workers from "
        "flapping back)",
    )
    rebalancer_backlog_seconds: float = Field(
        default=30.0,
        gt=0,
        description="A queue should clear within this: its requests count in a model's load as this much "
        "of a slot's time each",
    )
    rebalancer_horizon: float = Field(
        default=300.0,
        gt=0,
        description="Seconds the measured demand is assumed to hold: a move is made only if the worker "
        "would spend longer on the receiving queue within this than its load takes",
    )
    rebalancer_arrival_window: float = Field(
        default=60.0, gt=0, description="Seconds over which arrivals and service times are measured"
    )
    rebalancer_donor_window: float = Field(
        default=300.0,
        gt=0,
        description="A donor's traffic is also counted over this longer window, and its rate there is "
        "used unless the last arrival window's count shows it surely fell: a small fleet's quiet minute "
        "takes no worker",
    )
    rebalancer_default_load_seconds: float = Field(
        default=60.0,
        ge=0,
        description="The load time assumed for a worker and a model it has not reported loading",
    )
    rebalancer_pinned_workers: list[str] = Field(
        default_factory=list,
        description="Registered worker ids (or worker session ids) the rebalancer never moves",
    )
    rebalancer_move_timeout: float = Field(
        default=900.0,
        gt=0,
        description="Seconds after which a move its worker has not reported done counts as over",
    )

    @model_validator(mode="after")
    def _minimums_within_maximums(self) -> _RebalancerSettings:
        for model, most in self.rebalancer_max_workers.items():
            if self.rebalancer_min_workers.get(model, self.rebalancer_default_min_workers) > most:
                raise ValueError(f"rebalancer_max_workers[{model!r}] is below the model's minimum")
        if self.rebalancer_donor_utilization >= self.rebalancer_starved_utilization:
            raise ValueError(
                "rebalancer_donor_utilization must be below rebalancer_starved_utilization (the hysteresis)"
            )
        return self


class _PerUserLimitsAndTheOpenaiApiSettings(BaseModel):
    """Settings: per-user limits and the OpenAI API."""

    # Counted in the database, so they hold across replicas; 0 turns a limit off.
    rate_limit_per_minute: int = Field(
        default=60,
        ge=0,
        description="Generations (chat answers, completions, embeddings) per user per minute",
    )
    max_concurrent_generations_per_user: int = Field(
        default=8, ge=0, description="Pending plus in-progress generations per user"
    )
    # Off: API requests keep only their token counts once answered. On: each API conversation is
    # stored as a chat of the user, visible in the chat list.
    store_api_conversations: bool = False


# The groups below are the sections of the settings; pydantic takes a class's fields from its bases in
# reverse order, so they are listed last group first (the configuration reference keeps their order).
