"""Benchmark 9: 10,000 concurrent streams on one server process, served by 1,000 synthetic workers.

The workers are raw websocket clients in this process that speak the worker protocol (as in
bench/dispatch_latency.py), each with a few more slots than its share of the streams. A job gets its
first token at once and is then held: when every stream has its first token (all of them are open at
the same time), the workers release them all, each sending the rest of its tokens and the end. The
clients open the streams through ``/v1/chat/completions`` (``stream: true``) with at most ``--opening``
of them waiting for their first token at a time, so the time to first token measures the server with
the streams already open rather than a queue of requests.

Reported: errors, how many streams were open at once, the server's resident memory with all of them open
and its peak (VmHWM), the time to first token (all of it is added: a synthetic worker answers at once)
and the server's CPU.

    python -m bench.many_streams               # full: 10,000 streams, 1,000 workers
    python -m bench.many_streams --tiny        # CI: seconds
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.clients import OurApi, http_client
from bench.load import login_users
from bench.measure import cpu_seconds, message_times, peak_rss_mb, percentile, rss_mb
from bench.profile_hot_path import profile_during, py_spy, top_entries
from bench.report import Report, Table, Target, ms, num
from bench.script import main_wrapper, parser
from bench.stack import BenchRun, connect_synthetic_worker, instant_model_config
from tests.support.processes import wait_for_model

TOKENS = 4  # per stream: one at once, the rest after the release
USERS = 100
GIB = 1024  # MiB
# What a stream's client allows beyond the opening phase: the release and the read to its end.
AFTER_OPENING_SECONDS = 300.0


def client_timeout(open_timeout: float) -> float:
    """The clients' read timeout: a stream opened first is held, reading nothing, for the whole opening
    phase (``--open-timeout``), then read to its end; a fixed timeout would cut a long opening phase."""
    return open_timeout + AFTER_OPENING_SECONDS


class HoldingWorker:
    """A synthetic worker: the first token of each job at once, the rest when ``release`` is set."""

    def __init__(self, url: str, model_config: Any, slots: int, release: asyncio.Event):
        self.url = url
        self.model_config = model_config
        self.slots = slots
        self.release = release
        self.active = 0
        self.ws: Any = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.ws = await connect_synthetic_worker(self.url, self.model_config, self.slots)
        self._spawn(self._serve())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _serve(self) -> None:
        from oasst_shared.protocol import Ping, Pong, Token, Work, dump_frame, parse_server_frame

        async for raw in self.ws:
            frame = parse_server_frame(raw)
            if isinstance(frame, Ping):
                free = max(0, self.slots - self.active)
                await self.ws.send(dump_frame(Pong(ping_id=frame.ping_id, free_slots=free)))
            elif isinstance(frame, Work):
                self.active += 1
                await self.ws.send(dump_frame(Token(message_id=frame.message_id, text=" t0")))
                self._spawn(self._finish(frame.message_id))

    async def _finish(self, message_id: str) -> None:
        from oasst_shared.protocol import GeneratedText, Token, TokenBatch, dump_frame

        await self.release.wait()
        texts = [f" t{i}" for i in range(TOKENS)]
        rest = [Token(message_id=message_id, text=t) for t in texts[1:]]
        await self.ws.send(dump_frame(TokenBatch(tokens=rest)))
        done = GeneratedText(
            message_id=message_id, text="".join(texts), finish_reason="length", generated_tokens=TOKENS
        )
        await self.ws.send(dump_frame(done))
        self.active -= 1

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await self.ws.close()


@dataclass
class Streams:
    """What the clients saw: first tokens, ends, errors, and the moment every stream was open."""

    total: int
    ttft: list[float] = field(default_factory=list)
    complete: int = 0
    errors: list[str] = field(default_factory=list)
    message_ids: list[str] = field(default_factory=list)
    not_started: int = 0  # still waiting to open when the opening deadline passed: never sent
    deadline_passed: bool = False
    all_open: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def open_or_failed(self) -> int:
        return len(self.ttft) + len(self.errors)

    async def opened_or(self, deadline: float) -> None:
        """Until every stream is open or ``deadline`` (``time.monotonic()``) has passed."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.all_open.wait(), timeout=max(0.0, deadline - time.monotonic()))

    def check(self) -> None:
        if self.open_or_failed >= self.total:
            self.all_open.set()


async def one_stream(
    client: httpx.AsyncClient, url: str, model: str, token: str, opening: asyncio.Semaphore, streams: Streams
) -> None:
    """One streamed completion: holds an opening slot until its first token, then reads to [DONE]."""
    body = {"model": model, "messages": [{"role": "user", "content": "Hold me."}], "stream": True}
    body["max_tokens"] = 1000  # room for the in-progress time bound; the worker sends TOKENS
    headers = {"Authorization": f"Bearer {token}"}
    await opening.acquire()
    if streams.deadline_passed:
        opening.release()
        streams.not_started += 1
        return
    holding = True
    started = time.perf_counter()
    tokens = 0
    try:
        async with client.stream(
            "POST", f"{url}/v1/chat/completions", json=body, headers=headers
        ) as response:
            if response.status_code != 200:
                await response.aread()
                raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    raise RuntimeError(str(event["error"])[:200])
                if any((c.get("delta") or {}).get("content") for c in event.get("choices") or []):
                    tokens += 1
                    if holding:
                        streams.message_ids.append(str(event.get("id", "")).removeprefix("chatcmpl-"))
                        streams.ttft.append(time.perf_counter() - started)
                        holding = False
                        opening.release()
                        streams.check()
        if tokens != TOKENS:
            raise RuntimeError(f"{tokens} tokens of {TOKENS}")
        streams.complete += 1
    except Exception as exc:  # every failure is counted and reported, never raised
        streams.errors.append(f"{type(exc).__name__}: {exc}"[:300])
        if holding:
            streams.check()
    finally:
        if holding:
            opening.release()


async def run(args: argparse.Namespace) -> Report:
    total = args.streams or (20 if args.tiny else 10_000)
    workers = args.workers or (4 if args.tiny else 1_000)
    opening_limit = args.opening or (10 if args.tiny else 100)
    profile_seconds = 1.0 if args.tiny else 20.0
    slots = math.ceil(total / workers) + (2 if args.tiny else max(2, math.ceil(total / workers / 5)))
    report = Report(
        "many_streams",
        "9. Concurrent streams on one server process (synthetic workers)",
        args.tiny,
        params={
            "streams": total,
            "workers": workers,
            "slots_per_worker": slots,
            "opening_at_once": opening_limit,
            "tokens_per_stream": TOKENS,
            "users": min(USERS, total),
            "open_timeout_s": args.open_timeout,
        },
    )
    with BenchRun("many", keep_logs=args.keep_logs, embedded=args.embedded) as bench:
        server = bench.start_server(
            bench.database(),
            bench.redis_prefix(),
            OASST_SERVER_MAX_CONCURRENT_GENERATIONS_PER_USER="0",
            OASST_SERVER_MAX_SSE_READERS_PER_USER=str(total),
            # The synthetic workers share this process's event loop with every client: a pong may be late
            # by what the clients cost it, which is not the server's doing.
            OASST_SERVER_WORKER_PING_TIMEOUT="120",
        )
        model = f"bench-many-{uuid.uuid4().hex[:8]}"
        release = asyncio.Event()
        ws_url = server.url.replace("http://", "ws://", 1) + "/workers/work"
        pool = [HoldingWorker(ws_url, instant_model_config(model), slots, release) for _ in range(workers)]
        streams = Streams(total)
        try:
            for i in range(0, workers, 50):
                await asyncio.gather(*(w.start() for w in pool[i : i + 50]))
            await asyncio.to_thread(wait_for_model, server.url, model, 120, workers)
            async with http_client(total, client_timeout(args.open_timeout)) as client:
                api = OurApi(client, server.url)
                users = await login_users(api, min(USERS, total), f"many-{uuid.uuid4().hex[:6]}")
                opening = asyncio.Semaphore(opening_limit)
                cpu0 = cpu_seconds(server.pid)
                wall0 = time.perf_counter()
                tasks = [
                    asyncio.create_task(
                        one_stream(client, server.url, model, users[i % len(users)], opening, streams)
                    )
                    for i in range(total)
                ]
                sampled = None
                spy = py_spy()
                if spy is not None:  # the server while the streams open: what limits it if it fails
                    sampled = await profile_during(
                        spy, {"server": server.pid}, profile_seconds, 200, bench.log_dir, streams.opened_or
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(streams.all_open.wait(), timeout=args.open_timeout)
                opened_in = time.perf_counter() - wall0
                streams.deadline_passed = True
                held = len(streams.ttft) - streams.complete
                rss_all_open = rss_mb(server.pid)
                release.set()
                await asyncio.gather(*tasks)
                wall = time.perf_counter() - wall0
                server_cpu = cpu_seconds(server.pid) - cpu0
        finally:
            release.set()
            await asyncio.gather(*(w.close() for w in pool))
        peak = peak_rss_mb(server.pid)
        log = server.process.log_path.read_text(errors="replace")
        pool_timeouts = log.count("QueuePool limit")
        times = await message_times(server.database_url, streams.message_ids)
    waits = [
        t["started_at"] - t["enqueued_at"]
        for t in times.values()
        if t["started_at"] is not None and t["enqueued_at"] is not None
    ]
    errors = total - streams.complete
    p50, p99 = percentile(streams.ttft, 50), percentile(streams.ttft, 99)
    table = Table(
        f"{total:,} streams through /v1/chat/completions, {workers:,} synthetic workers of {slots} slots",
        [
            "open at once",
            "opened in s",
            "TTFT p50 ms",
            "TTFT p99 ms",
            "queue wait p50 ms",
            "p99",
            "server RSS all open MiB",
            "server peak RSS MiB",
            "server CPU-s",
            "complete",
            "errors",
        ],
    )
    table.rows.append(
        [
            f"{held:,}",
            num(opened_in, 1),
            ms(p50),
            ms(p99),
            ms(percentile(waits, 50)),
            ms(percentile(waits, 99)),
            num(rss_all_open),
            num(peak),
            num(server_cpu, 1),
            f"{streams.complete:,}",
            str(errors),
        ]
    )
    report.tables.append(table)
    report.metrics.update(
        streams=total,
        open_at_once=held,
        opened_in_s=opened_in,
        wall=wall,
        ttft_p50=p50,
        ttft_p99=p99,
        queue_wait_p50=percentile(waits, 50),
        queue_wait_p99=percentile(waits, 99),
        server_rss_all_open_mib=rss_all_open,
        server_peak_rss_mib=peak,
        server_cpu_s=server_cpu,
        database_pool_timeouts=pool_timeouts,
        not_started=streams.not_started,
        complete=streams.complete,
        errors=errors,
        first_error=streams.errors[0] if streams.errors else None,
    )
    if streams.errors:
        report.notes.append(f"{len(streams.errors)} streams failed; the first: {streams.errors[0]}")
    if streams.not_started:
        report.notes.append(
            f"{streams.not_started:,} streams were not started: they were still waiting for their turn to "
            f"open when the {args.open_timeout:.0f} s given to open them all had passed (counted as errors)"
        )
    if pool_timeouts:
        report.notes.append(
            f"the server's log has {pool_timeouts} waits for a database connection that timed out (the pool "
            "of OASST_SERVER_DATABASE_POOL_SIZE connections and as many overflow ones was exhausted)"
        )
    report.notes.append(
        "the time to first token is all added time (a synthetic worker sends the first token when the job "
        f"arrives); at most {opening_limit} streams wait for their first token at a time, the others being "
        "open and held. Workers and clients share this load generator's process and one core with it."
    )
    report.targets.append(
        Target(
            f"{total:,} concurrent streams on one process",
            "no error, peak RSS < 1 GiB; added TTFT p99 reported",
            f"{held:,} open at once, {errors} errors, peak RSS {num(peak)} MiB; TTFT p50 {ms(p50)} ms, "
            f"p99 {ms(p99)} ms",
            errors == 0 and held == total and peak < GIB,
        )
    )
    server_profile = sampled.profiles.get("server") if sampled else None
    if server_profile is not None and server_profile.samples:
        busy = 100 * sampled.cpu["server"] / sampled.wall if sampled and sampled.wall > 0 else None
        report.tables.append(
            top_entries(
                f"The server while the streams opened (py-spy, the first {num(profile_seconds)} s: "
                f"{server_profile.samples} busy samples, {num(busy)} % CPU)",
                server_profile,
            )
        )
    return report


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, help="concurrent streams (default 10,000)")
    p.add_argument("--workers", type=int, help="synthetic workers (default 1,000)")
    p.add_argument("--opening", type=int, help="streams waiting for their first token at once (default 100)")
    p.add_argument(
        "--open-timeout",
        type=float,
        default=600.0,
        help="seconds to wait for every stream to open (100 at a time: the last measured rate, some 26 a "
        "second on two cores shared with the load generator, needs more than 300)",
    )
    main_wrapper(run, p.parse_args())


if __name__ == "__main__":
    main()
