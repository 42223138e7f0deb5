"""The server refuses to start in production with a placeholder secret or the debug login."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from oasst_inference_server.settings import Settings


@pytest.mark.parametrize(
    "override, complaint",
    [
        ({"auth_secret": "dev-secret"}, "AUTH_SECRET"),
        ({"auth_secret": "dev-secret-for-local-development-only"}, "AUTH_SECRET"),  # the default
        ({"allow_debug_auth": True}, "debug auth"),
        ({"worker_api_keys": ["dev-worker-key"]}, "WORKER_API_KEYS"),
        ({"trusted_client_api_keys": ["change-me"]}, "TRUSTED_CLIENT_API_KEYS"),
        ({"admin_root_token": "short"}, "ADMIN_ROOT_TOKEN"),
        ({"auth_github_client_id": "id"}, "GITHUB_CLIENT_SECRET"),
        ({"auth_discord_client_id": "id", "auth_discord_client_secret": "changeme"}, "DISCORD_CLIENT_SECRET"),
    ],
)
def test_production_refuses_placeholder_secrets(override, complaint):
    good = {
        "environment": "production",
        "auth_secret": "x" * 40,
        "allow_debug_auth": False,
        "worker_api_keys": ["w" * 40],
        "trusted_client_api_keys": ["t" * 40],
        "admin_root_token": "a" * 40,
    }
    Settings(_env_file=None, **good)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match=complaint):
        Settings(_env_file=None, **{**good, **override})  # type: ignore[call-arg]
