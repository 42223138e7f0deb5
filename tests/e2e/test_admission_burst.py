"""Simultaneous requests of one user against a real server process hold its concurrency limit, on the
embedded default (SQLite, in-process broker) and on Postgres with Redis.

Twenty ``/v1/chat/completions`` streams are opened at once against a limit of eight generations per
user: exactly eight are admitted (200) and twelve refused (429), round after round. The stack's one
worker (the real CPU backend behind it) is frozen (SIGSTOP) for the rounds, so an admitted generation
stays running until every answer of the round is in: the count cannot move while it is tested. The
streams stay open until all twenty statuses are known (closing one cancels its generation).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.services import REDIS_URL, fresh_database, fresh_redis_prefix
from tests.support.stacks import BackendProcess, Stack, start_stack

pytestmark = pytest.mark.slow

LIMIT = 8
BURST = 20
ROUNDS = 4


@pytest.fixture(
    scope="module",
    params=["sqlite", pytest.param("postgres", marks=[pytest.mark.postgres, pytest.mark.redis])],
)
def frozen_stack(
    request: pytest.FixtureRequest, cpu_backend: BackendProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """A stack with a concurrency limit of 8 per user and no rate limit, whose worker is frozen."""
    log_dir: Path = tmp_path_factory.mktemp(f"admission-burst-{request.param}")
    settings = {
        "OASST_SERVER_MAX_CONCURRENT_GENERATIONS_PER_USER": str(LIMIT),
        "OASST_SERVER_RATE_LIMIT_PER_MINUTE": "0",
        # The frozen worker answers no pings: it must not be disconnected during the rounds.
        "OASST_SERVER_WORKER_PING_TIMEOUT": "600",
    }
    with contextlib.ExitStack() as stack_exit:
        if request.param == "sqlite":
            stack = start_stack(
                log_dir, cpu_backend.url, f"sqlite+aiosqlite:///{log_dir}/oasst.db", None, **settings
            )
        else:
            database = stack_exit.enter_context(fresh_database("oasst_burst"))
            prefix = stack_exit.enter_context(fresh_redis_prefix("burst"))
            stack = start_stack(
                log_dir,
                cpu_backend.url,
                database,
                REDIS_URL,
                OASST_SERVER_REDIS_KEY_PREFIX=prefix,
                **settings,
            )
        worker = stack.workers[0].proc
        worker.send_signal(signal.SIGSTOP)
        try:
            yield stack
        finally:
            worker.send_signal(signal.SIGCONT)
            stack.stop()


async def burst(url: str) -> list[int]:
    """The statuses of 20 simultaneous streams of a new user; each stays open until all are known."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        login = await client.get("/auth/callback/debug", params={"code": f"burst-{uuid.uuid4().hex[:8]}"})
        login.raise_for_status()
        headers = {"Authorization": f"Bearer {login.json()['access_token']['access_token']}"}
        body = {
            "model": "SmolLM2-135M-Instruct",
            "messages": [{"role": "user", "content": "Count to fifty."}],
            "max_tokens": 64,
            "stream": True,
        }
        statuses: list[int] = []
        all_known = asyncio.Event()

        async def one() -> None:
            async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
                statuses.append(response.status_code)
                if len(statuses) == BURST:
                    all_known.set()
                await all_known.wait()

        await asyncio.wait_for(asyncio.gather(*(one() for _ in range(BURST))), timeout=120)
        return statuses


def test_a_burst_of_one_user_is_admitted_exactly_up_to_the_limit(frozen_stack: Stack) -> None:
    for _ in range(ROUNDS):
        statuses = asyncio.run(burst(frozen_stack.url))
        assert sorted(set(statuses)) == [200, 429], statuses
        assert statuses.count(200) == LIMIT, statuses
