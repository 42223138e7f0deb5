"""schemathesis against the server's own OpenAPI document: no 5xx and no response outside the schema.

The server runs as a real process, on SQLite with the in-process broker and on Postgres with Redis.
schemathesis drives every operation (coverage, fuzzing and stateful phases, positive and negative
data) as a signed-in user, then the admin API with the admin token. ``make test`` runs a bounded
number of cases per operation; ``make fuzz`` sets ``OASST_FUZZ_EXAMPLES`` and ``OASST_FUZZ_MAX_TIME``
for a longer run.

Left out: ``DELETE /account`` (it would end the signed-in session the rest of the run uses).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.processes import free_port, start_process, wait_http_ok
from tests.support.services import REDIS_URL, fresh_database, fresh_redis_prefix
from tests.support.stacks import server_env

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("OASST_FUZZ_EXAMPLES", "8"))
MAX_TIME = os.environ.get("OASST_FUZZ_MAX_TIME")  # seconds per run; fuzzing repeats until spent
ADMIN_TOKEN = "fuzz-admin-root-token-0123456789abcdef"
# Not content_type_conformance: uvicorn itself answers a request line past its size limit with a
# text/plain 400 before the application sees it (seen with 40 KB generated query strings).
CHECKS = "not_a_server_error,response_schema_conformance"


@contextlib.contextmanager
def fuzz_server(backend: str, log_dir: Path) -> Iterator[str]:
    with contextlib.ExitStack() as stack:
        if backend == "sqlite":
            database, broker = f"sqlite+aiosqlite:///{log_dir}/fuzz.db", None
        else:
            database = stack.enter_context(fresh_database("oasst_fuzz"))
            broker = REDIS_URL
        extra = {
            "OASST_SERVER_ADMIN_ROOT_TOKEN": ADMIN_TOKEN,
            "OASST_SERVER_RATE_LIMIT_PER_MINUTE": "0",
            "OASST_SERVER_LOG_LEVEL": "INFO",
        }
        if broker:
            extra["OASST_SERVER_REDIS_KEY_PREFIX"] = stack.enter_context(fresh_redis_prefix("fuzz"))
        port = free_port()
        server = start_process(
            "server", "oasst_inference_server", server_env(port, database, broker, **extra), log_dir
        )
        stack.callback(server.stop)
        url = f"http://127.0.0.1:{port}"
        wait_http_ok(f"{url}/health", server, timeout=60)
        yield url
        assert server.alive(), server.log_tail()
        log = server.log_path.read_text(errors="replace")
        assert "unhandled error" not in log and "Traceback" not in log, server.log_tail(120)


def schemathesis(url: str, token: str, *filters: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        f"{url}/openapi.json",
        "--header",
        f"Authorization: Bearer {token}",
        "--checks",
        CHECKS,
        "--max-examples",
        str(EXAMPLES),
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--request-timeout",
        "20",
        "--workers",
        "1",
        "--seed",
        os.environ.get("OASST_FUZZ_SEED", "20261201"),
        "--warnings",
        "off",
        *(["--max-time", MAX_TIME] if MAX_TIME else []),
        *filters,
    ]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=3600)


def report(run: subprocess.CompletedProcess[str]) -> str:
    """The failures section, long lines (generated payloads) cut short."""
    text = run.stdout.split("FAILURES", 1)[-1]
    return "\n".join(line[:400] for line in text.splitlines())[-8000:] + run.stderr[-2000:]


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=[pytest.mark.postgres, pytest.mark.redis])]
)
def test_the_openapi_schema_holds_under_fuzzing(backend: str, tmp_path: Path) -> None:
    with fuzz_server(backend, tmp_path) as url:
        login = httpx.get(f"{url}/auth/callback/debug", params={"code": "fuzzer"}, timeout=10)
        token = login.json()["access_token"]["access_token"]
        as_user = schemathesis(
            url, token, "--exclude-path", "/account", "--exclude-path-regex", "^/admin", cwd=tmp_path
        )
        assert as_user.returncode == 0, report(as_user)
        assert "generated" in as_user.stdout  # it ran cases
        as_admin = schemathesis(url, ADMIN_TOKEN, "--include-path-regex", "^/admin", cwd=tmp_path)
        assert as_admin.returncode == 0, report(as_admin)
