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


def test_the_server_with_no_settings_refuses_to_start_and_names_the_secret(tmp_path):
    """Production is the default: no environment at all means production, and its missing secret is
    named (no traceback, no server)."""
    started = subprocess.run(
        [sys.executable, "-m", "oasst_inference_server"],
        env={k: v for k, v in os.environ.items() if not k.startswith("OASST_")},
        cwd=tmp_path,  # no .env file to read
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode == 2, started.stderr
    assert "OASST_SERVER_AUTH_SECRET" in started.stderr and "Traceback" not in started.stderr
    assert "OASST_SERVER_ENVIRONMENT=development" in started.stderr  # how to ask for development
    assert "Uvicorn running" not in started.stderr


def test_production_is_the_default_and_development_must_be_asked_for(monkeypatch):
    monkeypatch.delenv("OASST_SERVER_ENVIRONMENT", raising=False)
    secret = "4f1c8e2a9b7d6053e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8"
    production = Settings(_env_file=None, auth_secret=secret)  # type: ignore[call-arg]
    assert production.environment == "production"
    assert not production.allow_debug_auth and not production.docs_enabled and not production.metrics_enabled
    assert production.worker_api_keys == []  # keys come from the admin API
    development = Settings(_env_file=None, environment="development")  # type: ignore[call-arg]
    assert development.allow_debug_auth and development.docs_enabled and development.metrics_enabled
    assert development.worker_api_keys == ["dev-worker-key"]


def test_several_server_processes_need_redis_and_postgres():
    base = {"database_url": "postgresql+asyncpg://u@h/db", "broker_url": "redis://h:6379/0"}
    assert Settings(_env_file=None, processes=4, **base).processes == 4  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="OASST_SERVER_PROCESSES=2: the in-process broker") as no_redis:
        Settings(_env_file=None, processes=2, **{**base, "broker_url": None})  # type: ignore[call-arg]
    assert "OASST_SERVER_BROKER_URL" in str(no_redis.value) and "DATABASE_URL" not in str(no_redis.value)
    with pytest.raises(ValueError, match="OASST_SERVER_PROCESSES=2: SQLite") as on_sqlite:
        Settings(_env_file=None, processes=2, **{**base, "database_url": "sqlite+aiosqlite:///x.db"})  # type: ignore[call-arg]
    assert "OASST_SERVER_DATABASE_URL" in str(on_sqlite.value) and "BROKER_URL" not in str(on_sqlite.value)


def test_the_server_refuses_several_processes_on_the_embedded_defaults(tmp_path):
    """``make up``'s defaults (SQLite, the in-process broker) with two processes: the server exits before
    listening, naming the setting and what to use instead, with no traceback."""
    started = subprocess.run(
        [sys.executable, "-m", "oasst_inference_server"],
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("OASST_")},
            "OASST_SERVER_ENVIRONMENT": "development",
            "OASST_SERVER_PROCESSES": "2",
        },
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode == 2, started.stderr
    assert "OASST_SERVER_PROCESSES=2" in started.stderr
    assert "in-process broker cannot be shared" in started.stderr and "redis://" in started.stderr
    assert "OASST_SERVER_BROKER_URL" in started.stderr and "OASST_SERVER_DATABASE_URL" in started.stderr
    assert "Traceback" not in started.stderr and "Uvicorn running" not in started.stderr
    assert "OASST_SERVER_ENVIRONMENT=development" not in started.stderr  # not a production refusal
    assert not (tmp_path / ".data").exists()  # nothing created
