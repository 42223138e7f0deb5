"""Fixtures for fault injection: a stack with fast timeouts on Postgres + Redis, and the fake backend
(its helpers are in tests/support/fake_workers.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.support.fake_workers import FAST_TIMINGS, FakeBackend, start_fake_backend
from tests.support.services import REDIS_URL, fresh_database
from tests.support.stacks import BackendProcess, Stack, start_stack


@pytest.fixture(scope="module")
def fake_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeBackend]:
    backend = start_fake_backend(tmp_path_factory.mktemp("fake-backend"))
    yield backend
    backend.process.stop()


@pytest.fixture(scope="module")
def fault_database() -> Iterator[str]:
    # A database of its own: another stack's recovery loop on a shared database re-queues these tests'
    # pending messages on its own broker, and its workers of the same model answer them there.
    with fresh_database("oasst_faults") as url:
        yield url


@pytest.fixture(scope="module")
def fault_stack(
    cpu_backend: BackendProcess,
    fault_database: str,
    redis_prefix: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    """Postgres + Redis, fast failure detection, no worker yet (each test brings its own)."""
    log_dir = tmp_path_factory.mktemp("fault-stack")
    stack = start_stack(
        log_dir,
        cpu_backend.url,
        fault_database,
        REDIS_URL,
        workers=0,
        OASST_SERVER_REDIS_KEY_PREFIX=f"{redis_prefix}faults:{uuid.uuid4().hex[:6]}:",
        **FAST_TIMINGS,
    )
    yield stack
    stack.stop()
