"""``oasst-server`` and ``oasst-server admin``: usage errors and settings that cannot work.

The commands that reach a database are tested against Postgres in tests/api/test_operator_sign_in.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from oasst_inference_server.settings import Settings


def oasst_server(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OASST_")}
    return subprocess.run(
        [sys.executable, "-m", "oasst_inference_server", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_admin_cli_refuses_bad_names_and_bad_settings():
    bad_name = oasst_server("admin", "create-api-key", "--user", "no spaces please")
    assert bad_name.returncode == 2 and "--user" in bad_name.stderr
    # Production settings without their secrets: a clear message, no traceback, nothing created.
    production = oasst_server(
        "admin", "create-worker-key", "--name", "x", OASST_SERVER_ENVIRONMENT="production"
    )
    assert production.returncode == 2
    assert "OASST_SERVER_AUTH_SECRET" in production.stderr and "Traceback" not in production.stderr
    unknown = oasst_server("serve")
    assert unknown.returncode == 2 and "oasst-server admin" in unknown.stderr
    assert oasst_server("--help").returncode == 0


def test_several_server_processes_need_redis_and_postgres():
    base = {"database_url": "postgresql+asyncpg://u@h/db", "broker_url": "redis://h:6379/0"}
    assert Settings(_env_file=None, processes=4, **base).processes == 4  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="OASST_SERVER_PROCESSES"):
        Settings(_env_file=None, processes=2, **{**base, "broker_url": None})  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="OASST_SERVER_PROCESSES"):
        Settings(_env_file=None, processes=2, **{**base, "database_url": "sqlite+aiosqlite:///x.db"})  # type: ignore[call-arg]
