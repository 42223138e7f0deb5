"""Benchmark 3: dispatch latency, from enqueue to a worker receiving the job, at 1, 10 and 100 workers.

The workers are raw websocket clients in this process that speak the worker protocol (worker_info,
pong, generated_text) for a model of their own, so no real worker or backend is involved. Messages are
sent one at a time (nothing queues). For each we note when the client sent POST assistant_message, when
its response came back, and when a worker received the work frame; afterwards the database gives the
server's enqueued_at (stamped when the request handler builds the message) and started_at (the claim).
Both paths are measured, each on a server of its own: a job handed over at once to an idle worker (the
default) and a job queued (``OASST_SERVER_HAND_OVER_AT_ONCE=false``). The direct path is the floor of one
queue hop: RPUSH to BLPOP on Redis with the same number of waiting poppers.

    python -m bench.dispatch_latency             # full: 1, 10, 100 workers, 200 messages each
    python -m bench.dispatch_latency --tiny      # CI: seconds
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
import uuid
from typing import Any

from bench.clients import OurApi, http_client
from bench.measure import message_times, percentile
from bench.report import Report, Table, Target, ms
from bench.script import int_list, main_wrapper, parser
from bench.stack import BenchRun, connect_synthetic_worker, instant_model_config
from tests.support.processes import wait_for_model
from tests.support.services import REDIS_URL

PROMPT = "Dispatch me."


class RawWorker:
    """A protocol-speaking worker that records when work arrives and answers it at once."""

    def __init__(
        self,
        url: str,
        model_config: Any,
        arrivals: dict[str, float],
        waiters: dict[str, asyncio.Future[float]],
    ):
        self.url = url
        self.model_config = model_config
        self.arrivals = arrivals
        self.waiters = waiters
        self.task: asyncio.Task[None] | None = None
        self.ws: Any = None

    async def start(self) -> None:
        self.ws = await connect_synthetic_worker(self.url, self.model_config, 1)
        self.task = asyncio.create_task(self._serve())

    async def _serve(self) -> None:
        from oasst_shared.protocol import GeneratedText, Ping, Pong, Work, dump_frame, parse_server_frame

        async for raw in self.ws:
            received = time.perf_counter()
            frame = parse_server_frame(raw)
            if isinstance(frame, Ping):
                await self.ws.send(dump_frame(Pong(ping_id=frame.ping_id, free_slots=1)))
            elif isinstance(frame, Work):
                self.arrivals[frame.message_id] = received
                waiter = self.waiters.get(frame.message_id)
                if waiter is not None and not waiter.done():
                    waiter.set_result(received)
                result = GeneratedText(
                    message_id=frame.message_id, text="ok", finish_reason="length", generated_tokens=1
                )
                await self.ws.send(dump_frame(result))

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await self.ws.close()


async def redis_hop(poppers: int, samples: int) -> list[float]:
    """RPUSH -> BLPOP latency with ``poppers`` clients blocked on the list (the floor of one queue hop)."""
    from redis.asyncio import Redis

    key = f"bench:hop:{uuid.uuid4().hex[:8]}"
    clients = [Redis.from_url(REDIS_URL) for _ in range(poppers + 1)]
    sender, pop_clients = clients[0], clients[1:]
    received: asyncio.Queue[tuple[bytes, float]] = asyncio.Queue()

    async def pop(client: Redis) -> None:
        while True:
            item = await client.blpop([key], timeout=5)
            if item is not None:
                received.put_nowait((item[1], time.perf_counter()))

    tasks = [asyncio.create_task(pop(c)) for c in pop_clients]
    await asyncio.sleep(0.3)  # every popper is blocked now
    out = []
    try:
        for i in range(samples):
            sent = time.perf_counter()
            await sender.rpush(key, str(i))
            _, at = await asyncio.wait_for(received.get(), timeout=10)
            out.append(at - sent)
            await asyncio.sleep(0.002)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await sender.delete(key)
        for client in clients:
            await client.aclose()
    return out


async def run(args: argparse.Namespace) -> Report:
    levels = args.workers or ([1, 10] if args.tiny else [1, 10, 100])
    samples = args.samples or (10 if args.tiny else 200)
    report = Report(
        "dispatch_latency",
        "3. Dispatch latency (enqueue -> worker receives the job)",
        args.tiny,
        params={"workers": levels, "messages_per_level": samples},
    )
    table = Table(
        "One message at a time; ms; p50 / p99",
        [
            "path",
            "workers",
            "enqueue->worker p50",
            "p99",
            "POST sent->worker p50",
            "p99",
            "POST response->worker p50",
            "p99",
            "enqueue->claim p50",
            "POST round trip p50",
            "Redis hop p50",
            "p99",
            "lost",
        ],
    )
    modes = [("handed over", {}), ("queued", {"OASST_SERVER_HAND_OVER_AT_ONCE": "false"})]
    with BenchRun("dispatch", keep_logs=args.keep_logs, embedded=args.embedded) as bench:
        for mode, env in modes:
            server = bench.start_server(
                bench.database(), bench.redis_prefix(), OASST_SERVER_WORKER_PING_INTERVAL="5", **env
            )
            for level in levels:
                row, metrics = await _measure(server, level, samples, embedded=args.embedded)
                table.rows.append([mode, *row])
                report.metrics[str(level) if mode == "handed over" else f"{level} queued"] = metrics
                print(f"{mode}, {level} workers: done", flush=True)
            bench.stop(server.process)
    report.tables.append(table)
    report.notes.append(
        "enqueue->worker runs from the message's enqueued_at in the database (stamped in the request "
        "handler when the message is built, before its insert) to the raw worker receiving the work frame. "
        "'handed over' is the default path: nothing waits in the queue and a worker is idle, so the job is "
        "claimed and sent inside the transaction that inserts it, before its commit "
        "(OASST_SERVER_HAND_OVER_AT_ONCE). 'queued' is the same server with that setting off: the insert "
        "commits, the hint is pushed and popped, and the claim sends the work (its enqueue->worker includes "
        "the insert's commit). POST response->worker is negative when the worker has the job before the "
        "client has its response."
    )
    top = str(max(levels))
    if top in report.metrics and int(top) >= 100:
        value = report.metrics[top]["enqueue_to_worker_p50"]
        report.targets.append(
            Target(
                f"dispatch latency at {top} workers",
                "p50 <= 2 ms",
                f"p50 {ms(value, 2)} ms (enqueue->worker, handed over at once; queued path "
                f"{ms(report.metrics.get(top + ' queued', {}).get('enqueue_to_worker_p50'), 2)} ms)",
                None if value is None else value <= 0.002,
            )
        )
    return report


async def _measure(
    server: Any, level: int, samples: int, *, embedded: bool
) -> tuple[list[str], dict[str, Any]]:
    """One level: ``level`` raw workers, ``samples`` messages one at a time; the table row (without its
    path) and the metrics."""
    ws_url = server.url.replace("http://", "ws://", 1) + "/workers/work"
    async with http_client(8) as client:
        api = OurApi(client, server.url)
        token = await api.login("dispatch")
        model_name = f"bench-dispatch-{uuid.uuid4().hex[:8]}"
        config = instant_model_config(model_name)
        arrivals: dict[str, float] = {}
        waiters: dict[str, asyncio.Future[float]] = {}
        workers = [RawWorker(ws_url, config, arrivals, waiters) for _ in range(level)]
        try:
            for i in range(0, level, 20):
                await asyncio.gather(*(w.start() for w in workers[i : i + 20]))
            await asyncio.to_thread(wait_for_model, server.url, model_name, workers=level)
            await asyncio.sleep(0.5)
            setups = [await _setup(api, token) for _ in range(samples + 3)]
            sent: dict[str, float] = {}
            responded: dict[str, float] = {}
            lost = 0
            for n, (chat_id, parent_id) in enumerate(setups):
                loop = asyncio.get_running_loop()
                waiter: asyncio.Future[float] = loop.create_future()
                t0 = time.perf_counter()
                message_id = await api.assistant(token, chat_id, parent_id, model_name, 1)
                t1 = time.perf_counter()
                if message_id in arrivals:
                    waiter.set_result(arrivals[message_id])
                waiters[message_id] = waiter
                try:
                    await asyncio.wait_for(waiter, timeout=10)
                except asyncio.TimeoutError:
                    lost += 1
                    continue
                if n >= 3:  # the first few warm the pools up
                    sent[message_id], responded[message_id] = t0, t1
                await _wait_finished(api, token, chat_id, message_id)
            times = await message_times(server.database_url, sent)
        finally:
            await asyncio.gather(*(w.close() for w in workers))
        # perf_counter -> wall clock, to compare with the database's timestamps.
        offset = time.time() - time.perf_counter()
        post_to_work = [arrivals[m] - sent[m] for m in sent]
        resp_to_work = [arrivals[m] - responded[m] for m in sent]
        round_trip = [responded[m] - sent[m] for m in sent]
        enqueue_to_work = []
        enqueue_to_claim = []
        for m in sent:
            stamps = times.get(m) or {}
            enq, claim = stamps.get("enqueued_at"), stamps.get("started_at")
            if enq is not None:
                value = arrivals[m] + offset - enq
                if -1 < value < 60:  # same clock: anything else is a clock mismatch
                    enqueue_to_work.append(value)
                if claim is not None:
                    enqueue_to_claim.append(claim - enq)
        hop = await redis_hop(level, samples) if not embedded else []
    row = [
        str(level),
        ms(percentile(enqueue_to_work, 50), 2),
        ms(percentile(enqueue_to_work, 99), 2),
        ms(percentile(post_to_work, 50), 2),
        ms(percentile(post_to_work, 99), 2),
        ms(percentile(resp_to_work, 50), 2),
        ms(percentile(resp_to_work, 99), 2),
        ms(percentile(enqueue_to_claim, 50), 2),
        ms(percentile(round_trip, 50), 2),
        ms(percentile(hop, 50), 2),
        ms(percentile(hop, 99), 2),
        str(lost),
    ]
    metrics = {
        "enqueue_to_worker_p50": percentile(enqueue_to_work, 50),
        "enqueue_to_worker_p99": percentile(enqueue_to_work, 99),
        "post_to_worker_p50": percentile(post_to_work, 50),
        "post_to_worker_p99": percentile(post_to_work, 99),
        "response_to_worker_p50": percentile(resp_to_work, 50),
        "response_to_worker_p99": percentile(resp_to_work, 99),
        "enqueue_to_claim_p50": percentile(enqueue_to_claim, 50),
        "post_round_trip_p50": percentile(round_trip, 50),
        "redis_hop_p50": percentile(hop, 50),
        "redis_hop_p99": percentile(hop, 99),
        "samples": len(sent),
        "lost": lost,
    }
    return row, metrics


async def _setup(api: OurApi, token: str) -> tuple[str, str]:
    chat_id = await api.create_chat(token)
    return chat_id, await api.prompter(token, chat_id, None, PROMPT)


async def _wait_finished(api: OurApi, token: str, chat_id: str, message_id: str) -> None:
    """Until the server has taken the worker's result (so the worker's slot is free again)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        response = await api.client.get(
            f"{api.base}/chats/{chat_id}/messages/{message_id}", headers=api.auth(token)
        )
        if response.status_code == 200 and response.json().get("state") not in ("pending", "in_progress"):
            return
        await asyncio.sleep(0.002)


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int_list, help="comma-separated numbers of workers")
    p.add_argument("--samples", type=int, help="messages per level")
    main_wrapper(run, p.parse_args())


if __name__ == "__main__":
    main()
