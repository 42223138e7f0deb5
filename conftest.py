"""Fixtures shared by every package's tests: the real Postgres, Redis, CPU backend and whole stacks.

Every fixture here starts real processes or uses the real local services; each test database and
Redis key prefix is created for the run and removed afterwards. The helpers behind them are in
``tests/support/`` (the benchmarks use them too).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator

import pytest

from tests.support.clients import close_all
from tests.support.services import REDIS_URL, fresh_database, fresh_redis_prefix
from tests.support.stacks import BackendProcess, Stack, start_cpu_backend, start_stack

# Production is the server's default; the tests ask for development (known secrets, debug login,
# /docs and /metrics) here, for in-process apps and for every server process they start. A test of
# production mode sets its own environment.
os.environ["OASST_SERVER_ENVIRONMENT"] = "development"

# A shell starts background jobs (`make test &`) with SIGINT ignored, and children inherit that: the
# Ctrl-C tests of the text-client would then test nothing. A handler here is reset to the default in
# every child process, so they get Ctrl-C as a terminal would send it.
signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def _close_clients() -> Iterator[None]:
    """Close the HTTP clients tests opened without a ``with`` block (tests/support/clients.py)."""
    yield
    close_all()
    # llama-cpp-python opens two /dev/null files when it is imported (llama_cpp/_utils.py) and never
    # closes them: Python would report them at exit, after the summary. Close them with the session.
    llama_utils = sys.modules.get("llama_cpp._utils")
    for name in ("outnull_file", "errnull_file"):
        opened = getattr(llama_utils, name, None)
        if opened is not None:
            opened.close()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh Postgres database for this test session, dropped at the end."""
    with fresh_database() as url:
        yield url


@pytest.fixture(scope="session")
def redis_prefix() -> Iterator[str]:
    """A Redis key prefix for this test session; every key under it is deleted at the end."""
    with fresh_redis_prefix() as prefix:
        yield prefix


@pytest.fixture(scope="session")
def cpu_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackendProcess]:
    """The bundled CPU backend serving SmolLM2, shared by the whole session."""
    backend = start_cpu_backend(tmp_path_factory.mktemp("cpu-backend"))
    try:
        yield backend
    finally:
        backend.process.stop()


@pytest.fixture(scope="session")
def embedded_stack(cpu_backend: BackendProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Server on SQLite with the in-process broker, one worker, the real CPU backend."""
    log_dir = tmp_path_factory.mktemp("embedded-stack")
    stack = start_stack(log_dir, cpu_backend.url, f"sqlite+aiosqlite:///{log_dir}/oasst.db", None)
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def production_stack(
    cpu_backend: BackendProcess,
    postgres_url: str,
    redis_prefix: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    """Server on Postgres and Redis, one worker, the real CPU backend."""
    log_dir = tmp_path_factory.mktemp("production-stack")
    stack = start_stack(
        log_dir, cpu_backend.url, postgres_url, REDIS_URL, OASST_SERVER_REDIS_KEY_PREFIX=redis_prefix
    )
    yield stack
    stack.stop()
