"""What production mode refuses: placeholder, short or empty secrets, and unsafe switches.

The server starts in production unless ``OASST_SERVER_ENVIRONMENT=development`` is set (``make up``
and the tests set it). Development fills in known secrets (``DEV_AUTH_SECRET``, ``DEV_WORKER_KEY``)
and turns on the debug login, ``/docs`` and ``/metrics``; production has none of them unless
configured. Every refusal names the setting to change, so an operator starting the server with no
settings learns what to set from the first error.
"""

from __future__ import annotations

from typing import Protocol


class Settings(Protocol):
    """The settings this module reads (``settings.Settings``, which imports this module, has them)."""

    auth_secret: str
    worker_api_keys: list[str]
    trusted_worker_api_keys: list[str]
    admin_root_token: str | None
    metrics_token: str | None
    auth_github_client_id: str | None
    auth_github_client_secret: str | None
    auth_discord_client_id: str | None
    auth_discord_client_secret: str | None
    allow_debug_auth: bool | None
    cors_origins: list[str]

    def trusted_client_keys(self) -> dict[str, str]: ...


# The development default is 32+ bytes only so that PyJWT does not warn on every token in `make up`.
DEV_AUTH_SECRET = "dev-secret-for-local-development-only"
DEV_WORKER_KEY = "dev-worker-key"
PLACEHOLDER_SECRETS = frozenset(
    {
        "",
        "change-me",
        "changeme",
        "secret",
        "password",
        "dev-secret",
        DEV_AUTH_SECRET,
        DEV_WORKER_KEY,
        "64-random-hex-characters",
    }
)
MIN_SECRET_LENGTH = 32
MIN_KEY_LENGTH = 16


def _weak(value: str, min_length: int) -> bool:
    value = value.strip()
    return value.lower() in PLACEHOLDER_SECRETS or len(value) < min_length or len(set(value)) < 8


def production_problems(settings: Settings) -> list[str]:
    """Every reason ``settings`` may not run in production, each naming its environment variable."""
    problems = []
    if _weak(settings.auth_secret, MIN_SECRET_LENGTH):
        problems.append(
            "set OASST_SERVER_AUTH_SECRET to a random string of 32+ characters (openssl rand -hex 32)"
        )
    if any(_weak(k, MIN_KEY_LENGTH) for k in settings.worker_api_keys):
        problems.append(
            "OASST_SERVER_WORKER_API_KEYS: each key needs 16+ random characters (the development key "
            "is refused); or leave it empty and create keys with `oasst-server admin create-worker-key`"
        )
    if any(_weak(k, MIN_KEY_LENGTH) for k in settings.trusted_worker_api_keys):
        problems.append("OASST_SERVER_TRUSTED_WORKER_API_KEYS: each key needs 16+ random characters")
    if any(_weak(k, MIN_KEY_LENGTH) for k in settings.trusted_client_keys().values()):
        problems.append("OASST_SERVER_TRUSTED_CLIENT_API_KEYS: each key needs 16+ random characters")
    if settings.admin_root_token is not None and _weak(settings.admin_root_token, MIN_SECRET_LENGTH):
        problems.append("set OASST_SERVER_ADMIN_ROOT_TOKEN to a random string of 32+ characters, or unset it")
    if settings.metrics_token is not None and _weak(settings.metrics_token, MIN_SECRET_LENGTH):
        problems.append("set OASST_SERVER_METRICS_TOKEN to a random string of 32+ characters, or unset it")
    for provider in ("github", "discord"):
        client_id = getattr(settings, f"auth_{provider}_client_id")
        secret = getattr(settings, f"auth_{provider}_client_secret")
        if client_id and (secret is None or secret.strip().lower() in PLACEHOLDER_SECRETS):
            problems.append(f"OASST_SERVER_AUTH_{provider.upper()}_CLIENT_SECRET is missing")
    if settings.allow_debug_auth:
        problems.append(
            "OASST_SERVER_ALLOW_DEBUG_AUTH: the password-less debug login is refused in production"
        )
    if "*" in settings.cors_origins:
        problems.append(
            "OASST_SERVER_CORS_ORIGINS: '*' is refused in production (the API allows credentials): "
            "list the origins"
        )
    return problems


def check_production(settings: Settings) -> None:
    problems = production_problems(settings)
    if problems:
        raise ValueError("production mode: " + "; ".join(problems))
