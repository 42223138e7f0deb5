"""Server settings, read from the environment (prefix ``OASST_SERVER_``) or a ``.env`` file.

One class per section (in settings_sections); :class:`Settings` inherits them all, in reverse, so that the
fields keep their order in the generated reference (docs/configuration.md)."""

from __future__ import annotations

from functools import lru_cache

from pydantic import model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from oasst_inference_server.production import DEV_AUTH_SECRET, DEV_WORKER_KEY, check_production
from oasst_inference_server.settings_sections.edge import (
    _AdminApiSettings,
    _ChatLimitsSettings,
    _TheEdgeSettings,
    _UsersAndAuthSettings,
    _WhatProductionServesSettings,
)
from oasst_inference_server.settings_sections.moderation import _ModerationSettings
from oasst_inference_server.settings_sections.process import (
    _DatabaseAndBrokerSettings,
    _EventStreamsSettings,
    _TheProcessSettings,
    _TokensAndTheUserCacheSettings,
)
from oasst_inference_server.settings_sections.routing import _ModelAliasesAndFallbacksSettings
from oasst_inference_server.settings_sections.scheduling import (
    _PerUserLimitsAndTheOpenaiApiSettings,
    _RebalancerSettings,
    _SchedulingSettings,
)
from oasst_inference_server.settings_sections.workers import (
    _DispatchHandOverLeasesRetriesSettings,
    _ModelsAndWorkerSocketsSettings,
    _ModelSwitchingSettings,
    _RecoverySettings,
    _TrustedWorkersAndComplianceChecksSettings,
)
from oasst_inference_server.trusted_client_names import parse_trusted_client_entry


class Settings(
    _ModelAliasesAndFallbacksSettings,
    _ModerationSettings,
    _PerUserLimitsAndTheOpenaiApiSettings,
    _RebalancerSettings,
    _SchedulingSettings,
    _ChatLimitsSettings,
    _AdminApiSettings,
    _UsersAndAuthSettings,
    _WhatProductionServesSettings,
    _TheEdgeSettings,
    _RecoverySettings,
    _TrustedWorkersAndComplianceChecksSettings,
    _DispatchHandOverLeasesRetriesSettings,
    _ModelSwitchingSettings,
    _ModelsAndWorkerSocketsSettings,
    _TokensAndTheUserCacheSettings,
    _EventStreamsSettings,
    _DatabaseAndBrokerSettings,
    _TheProcessSettings,
    BaseSettings,
):
    model_config = SettingsConfigDict(
        env_prefix="OASST_SERVER_", env_file=".env", env_ignore_empty=True, extra="ignore"
    )

    @model_validator(mode="after")
    def _trusted_only_tiers_exist(self) -> Settings:
        unknown = [t for t in self.trusted_workers_only_tiers if t not in self.user_tiers]
        if unknown:
            raise ValueError(
                f"trusted_workers_only_tiers names tiers not in user_tiers: {', '.join(unknown)}"
            )
        return self

    @model_validator(mode="after")
    def _trusted_client_names(self) -> Settings:
        names = [parse_trusted_client_entry(e)[0] for e in self.trusted_client_api_keys]
        if len(set(names)) != len(names):
            raise ValueError("OASST_SERVER_TRUSTED_CLIENT_API_KEYS: one key per client name")
        return self

    @model_validator(mode="after")
    def _default_tier_exists(self) -> Settings:
        if self.default_user_tier not in self.user_tiers:
            raise ValueError(f"default_user_tier {self.default_user_tier!r} is not one of user_tiers")
        if any(weight <= 0 for weight in self.user_tiers.values()):
            raise ValueError("user_tiers weights must be positive")
        return self

    @model_validator(mode="after")
    def _development_defaults(self) -> Settings:
        # Known secrets and the debug login exist only when development is asked for explicitly.
        if self.environment == "development":
            # Set by name: mypy cannot infer an assignment to a field its section declares in another
            # module ("cannot determine type").
            defaults: dict[str, object] = {}
            if not self.auth_secret:
                defaults["auth_secret"] = DEV_AUTH_SECRET
            if not self.worker_api_keys:
                defaults["worker_api_keys"] = [DEV_WORKER_KEY]
            for name, value in defaults.items():
                setattr(self, name, value)
        development = self.environment == "development"
        for flag in ("allow_debug_auth", "docs_enabled", "metrics_enabled"):
            if getattr(self, flag) is None:
                setattr(self, flag, development)
        return self

    @model_validator(mode="after")
    def _refuse_placeholders_in_production(self) -> Settings:
        if self.environment == "production":
            check_production(self)
        return self

    @model_validator(mode="after")
    def _several_processes_share_redis_and_postgres(self) -> Settings:
        # The in-process broker lives in one process (the others would never see its queues, streams
        # and locks), and SQLite takes one writer at a time.
        if self.processes == 1:
            return self
        needs = []
        if not (self.broker_url or "").startswith("redis"):
            needs.append(
                "the in-process broker cannot be shared between processes: set OASST_SERVER_BROKER_URL "
                "to a Redis URL (redis://HOST:6379/0)"
            )
        if self.is_sqlite:
            needs.append(
                "SQLite takes one writer at a time: set OASST_SERVER_DATABASE_URL to a Postgres URL "
                "(postgresql://USER:PASSWORD@HOST:5432/DB)"
            )
        if needs:
            raise ValueError(
                f"OASST_SERVER_PROCESSES={self.processes}: " + "; ".join(needs) + " (or run one process)"
            )
        return self

    def in_progress_bound(self, max_new_tokens: int) -> float:
        """Seconds a message may stay in_progress on one try."""
        return self.in_progress_grace + max_new_tokens / self.min_generation_rate

    def trusted_client_keys(self) -> dict[str, str]:
        """Client name -> its key (``trusted_client_api_keys`` entries are ``NAME:KEY`` or a bare key)."""
        return dict(parse_trusted_client_entry(entry) for entry in self.trusted_client_api_keys)

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")


@lru_cache
def get_settings() -> Settings:
    return Settings()
