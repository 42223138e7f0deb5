"""``oasst-server admin`` in a process of its own, on the app's database, as an operator runs it in the
server's container: none of the test process's ``OASST_*`` variables, only the database's and ``env``."""

from __future__ import annotations

import os
import subprocess
import sys

from oasst_inference_server.settings import Settings

TIMEOUT = 120


def _argv(args: tuple[str, ...]) -> list[str]:
    return [sys.executable, "-m", "oasst_inference_server", "admin", *args]


def _env(settings: Settings, env: dict[str, str]) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OASST_")}
    return {
        **clean,
        "OASST_SERVER_ENVIRONMENT": "development",
        "OASST_SERVER_DATABASE_URL": settings.database_url,
        **env,
    }


def admin_cli(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``oasst-server admin ARGS``; its output as text."""
    return subprocess.run(
        _argv(args), env=_env(settings, env), capture_output=True, text=True, timeout=TIMEOUT
    )


def admin_cli_bytes(settings: Settings, *args: str) -> subprocess.CompletedProcess[bytes]:
    """Run ``oasst-server admin ARGS``; its output as bytes (a gzip-compressed export)."""
    return subprocess.run(_argv(args), env=_env(settings, {}), capture_output=True, timeout=TIMEOUT)
