"""Load shapes and their summary: many users logged in at once, a closed loop of ``concurrency`` streams
(:func:`closed_loop`, :func:`prepare_ours`), loops that run until a deadline (:func:`until`), and what a
load's results add up to (:class:`LoadSummary`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.clients import OurApi, StreamResult
from bench.measure import percentile


async def login_users(api: OurApi, count: int, prefix: str, concurrency: int = 32) -> list[str]:
    semaphore = asyncio.Semaphore(concurrency)

    async def one(i: int) -> str:
        async with semaphore:
            return await api.login(f"{prefix}-{i}")

    return list(await asyncio.gather(*(one(i) for i in range(count))))


async def gather_limited(factories: Sequence[Callable[[], Awaitable[Any]]], concurrency: int) -> list[Any]:
    semaphore = asyncio.Semaphore(concurrency)

    async def one(factory: Callable[[], Awaitable[Any]]) -> Any:
        async with semaphore:
            return await factory()

    return list(await asyncio.gather(*(one(f) for f in factories)))


async def closed_loop(
    concurrency: int, total: int, request: Callable[[int, int], Awaitable[StreamResult]]
) -> list[StreamResult]:
    """``total`` requests, ``concurrency`` at a time: task k sends requests k, k + c, k + 2c, ... in turn.

    ``request(task, index)`` is awaited for every index in 0..total-1; index i always runs on task
    ``i % concurrency``, so per-task state (a user, a chat) can be prepared by index.
    """
    c = max(1, min(concurrency, total))
    results: list[StreamResult] = []

    async def task(k: int) -> None:
        for index in range(k, total, c):
            results.append(await request(k, index))

    await asyncio.gather(*(task(k) for k in range(c)))
    return results


async def until(
    deadline: float,
    request: Callable[[int, int], Awaitable[StreamResult]],
    tasks: int,
    *,
    stagger: float = 0.0,
    clock: Callable[[], float] = time.monotonic,
) -> list[StreamResult]:
    """``tasks`` loops, each sending ``request(task, index)`` back to back (index 0, 1, ...) until
    ``deadline`` (a ``clock()`` value); task k starts ``stagger * k / tasks`` seconds late."""
    results: list[StreamResult] = []

    async def task(k: int) -> None:
        await asyncio.sleep(stagger * k / tasks)
        i = 0
        while clock() < deadline:
            results.append(await request(k, i))
            i += 1

    await asyncio.gather(*(task(k) for k in range(tasks)))
    return results


async def prepare_ours(
    apis: Sequence[OurApi],
    users: Sequence[str],
    concurrency: int,
    total: int,
    model: str,
    tokens: int,
    prompt: str,
    readers: int = 1,
) -> Callable[[], Awaitable[list[StreamResult]]]:
    """Make the chats and prompts of a closed-loop load (untimed); return the timed part to await.

    Task k sends its requests as ``users[k]`` to ``apis[k % len(apis)]`` (several replicas: round robin),
    and reads each answer with ``readers`` event streams at once.
    """
    c = max(1, min(concurrency, total))

    async def setup(i: int) -> tuple[str, str]:
        k = i % c
        api, user = apis[k % len(apis)], users[k]
        chat_id = await api.create_chat(user)
        return chat_id, await api.prompter(user, chat_id, None, prompt)

    setups = await gather_limited([lambda i=i: setup(i) for i in range(total)], concurrency=min(c, 50))

    async def request(k: int, i: int) -> StreamResult:
        chat_id, parent_id = setups[i]
        return await apis[k % len(apis)].ask(users[k], chat_id, parent_id, model, tokens, readers)

    async def timed() -> list[StreamResult]:
        return await closed_loop(c, total, request)

    return timed


@dataclass
class LoadSummary:
    requests: int
    errors: int
    tokens: int
    wall: float
    ttft: list[float]
    first_error: str | None
    rejected: int = 0  # errors that were the server's refusals (HTTP 429/503: queue full, rate limit)

    @property
    def error_cell(self) -> str:
        return f"{self.errors} ({self.rejected} refused)" if self.rejected else str(self.errors)

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.wall if self.wall > 0 else None

    def ttft_p(self, q: float) -> float | None:
        return percentile(self.ttft, q)


def summarize(results: Sequence[StreamResult]) -> LoadSummary:
    good = [r for r in results if r.ok]
    errors = [r for r in results if not r.ok]
    start = min((r.started for r in results), default=0.0)
    end = max((r.ended or r.started for r in results), default=0.0)
    return LoadSummary(
        requests=len(results),
        errors=len(errors),
        tokens=sum(r.tokens for r in good),
        wall=end - start,
        ttft=[r.ttft for r in good if r.ttft is not None],
        first_error=errors[0].error if errors else None,
        rejected=sum(1 for r in errors if r.error and ("HTTP 503" in r.error or "HTTP 429" in r.error)),
    )
