"""``oasst-server admin keys|set-key-limits|set-user-limits|usage`` on a SQLite database: the admin API's
shapes as JSON, limits validated with a clear message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oasst_inference_server.admin_cli import main
from oasst_inference_server.settings import Settings


def run(capsys: pytest.CaptureFixture[str], settings: Settings, *args: str) -> str:
    assert main(list(args), settings=settings) == 0
    return capsys.readouterr().out


def test_limits_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = Settings(_env_file=None, database_url=f"sqlite+aiosqlite:///{tmp_path}/cli.db")  # type: ignore[call-arg]
    run(capsys, settings, "create-api-key", "--user", "alice")
    (key,) = json.loads(run(capsys, settings, "keys"))
    assert key["limits"]["requests_per_minute"] is None and key["usage"]["requests_today"] == 0
    changed = json.loads(
        run(
            capsys,
            settings,
            "set-key-limits",
            key["id"],
            "--requests-per-minute",
            "30",
            "--budget-usd",
            "2.5",
            "--budget-period",
            "month",
            "--allowed-models",
            "b,a",
        )
    )
    assert changed["limits"] == {
        "requests_per_minute": 30,
        "tokens_per_minute": None,
        "budget_tokens": None,
        "budget_usd": 2.5,
        "budget_period": "month",
        "allowed_models": ["a", "b"],
    }
    assert (
        json.loads(run(capsys, settings, "keys", "--user-id", key["user_id"]))[0]["limits"]
        == changed["limits"]
    )
    user = json.loads(
        run(
            capsys,
            settings,
            "set-user-limits",
            key["user_id"],
            "--budget-tokens",
            "1000",
            "--budget-period",
            "day",
        )
    )
    assert user["limits"]["budget_tokens"] == 1000
    assert json.loads(run(capsys, settings, "usage", "--key-id", key["id"])) == []
    with pytest.raises(SystemExit, match="budget_period"):
        main(["set-key-limits", key["id"], "--budget-tokens", "5"], settings=settings)
    with pytest.raises(SystemExit, match="api_key_not_found"):
        main(["set-key-limits", "no-such-key"], settings=settings)
    with pytest.raises(SystemExit, match="window_too_long"):
        main(["usage", "--since", "2020-01-01", "--until", "2024-01-01"], settings=settings)
