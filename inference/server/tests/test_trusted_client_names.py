"""A trusted frontend's client name (``OASST_SERVER_TRUSTED_CLIENT_API_KEYS`` entries ``NAME:KEY``) is
matched whole: a name ending in a newline, which ``re.match`` with ``$`` took, is refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from oasst_inference_server.settings import Settings


def settings(entry: str) -> Settings:
    return Settings(_env_file=None, environment="development", trusted_client_api_keys=[entry])  # type: ignore[call-arg]


@pytest.mark.parametrize("name", ["web\n", "web\r\n", "\nweb", "web ", "Web", "w eb", "", "x" * 25])
def test_a_client_name_must_match_whole(name):
    with pytest.raises(ValidationError, match="TRUSTED_CLIENT_API_KEYS"):
        settings(f"{name}:a-key-of-this-frontend")


def test_ordinary_client_names_pass():
    for name in ("website", "discord", "bot-2.eu_west", "x" * 24):
        assert settings(f"{name}:a-key-of-this-frontend").trusted_client_keys() == {
            name: "a-key-of-this-frontend"
        }
