"""Benchmark 8: scheduling. A heavy user and many light users share a model's workers.

The heavy user queues many answers at once; a moment later each light user asks one question. We note
each light user's time to first token (from its POST assistant_message to the first token event) on a
server with fair queuing (the default) and on one with ``fair_queuing`` off (one first-come-first-served
queue, the scheduling before fair queues). The backend is the instant one, paced (``--token-delay``) so that the workers,
not the server, are the bottleneck: the queue is where the light users' time goes.

The second part is the dispatch latency (enqueue to the worker receiving the job) at 1, 10 and 100
workers: the measurement of ``dispatch_latency.py``, run here as well so this report has both.

    python -m bench.scheduling             # full: 120 heavy answers, 20 light users; 1, 10, 100 workers
    python -m bench.scheduling --tiny      # CI: seconds
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

from bench import dispatch_latency
from bench.clients import OurApi, http_client
from bench.measure import percentile
from bench.report import Report, Table, Target
from bench.script import main_wrapper, parser
from bench.stack import INSTANT_MODEL, BenchRun
from tests.support.processes import wait_for_model

PROMPT = "Tell me something."


async def one_run(args: argparse.Namespace, fair: bool) -> dict[str, object]:
    heavy_count = args.heavy or (12 if args.tiny else 120)
    light_count = args.light or (3 if args.tiny else 20)
    with BenchRun(f"scheduling-{'fair' if fair else 'fifo'}", keep_logs=args.keep_logs) as bench:
        backend = bench.start_instant_backend(chunk=1, token_delay=args.token_delay)
        server = bench.start_server(
            bench.database(), bench.redis_prefix(), OASST_SERVER_FAIR_QUEUING="true" if fair else "false"
        )
        for _ in range(args.worker_count):
            bench.start_worker(server.url, backend, model=INSTANT_MODEL, max_parallel=args.slots)
        wait_for_model(server.url, INSTANT_MODEL, workers=args.worker_count)
        async with http_client(64) as client:
            api = OurApi(client, server.url)
            heavy = await api.login(f"heavy-{uuid.uuid4().hex[:6]}")
            lights = [await api.login(f"light-{i}-{uuid.uuid4().hex[:6]}") for i in range(light_count)]
            heavy_chats = []
            for _ in range(heavy_count):
                chat = await api.create_chat(heavy)
                heavy_chats.append((chat, await api.prompter(heavy, chat, None, PROMPT)))
            light_chats = []
            for token in lights:
                chat = await api.create_chat(token)
                light_chats.append((token, chat, await api.prompter(token, chat, None, PROMPT)))
            started = time.perf_counter()
            heavy_ids = await asyncio.gather(
                *(
                    api.assistant(heavy, chat, parent, INSTANT_MODEL, args.tokens)
                    for chat, parent in heavy_chats
                )
            )
            await asyncio.sleep(0.2)  # the heavy backlog is queued; now the light users come
            results = await asyncio.gather(
                *(
                    api.ask(token, chat, parent, INSTANT_MODEL, args.tokens)
                    for token, chat, parent in light_chats
                )
            )
            errors = [r.error for r in results if r.error]
            # Let the heavy backlog drain, so the run ends with every message finished.
            for chat_id, message_id in zip((c for c, _ in heavy_chats), heavy_ids, strict=True):
                deadline = time.monotonic() + 300
                while time.monotonic() < deadline:
                    response = await client.get(
                        f"{server.url}/chats/{chat_id}/messages/{message_id}", headers=api.auth(heavy)
                    )
                    if response.json().get("state") not in ("pending", "in_progress"):
                        break
                    await asyncio.sleep(0.05)
            total = time.perf_counter() - started
    ttfts = [r.ttft for r in results if r.ttft is not None]
    return {
        "fair": fair,
        "heavy_requests": heavy_count,
        "light_users": light_count,
        "light_ttft_p50": percentile(ttfts, 50),
        "light_ttft_p99": percentile(ttfts, 99),
        "light_ttft_max": max(ttfts) if ttfts else None,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "total_seconds": total,
    }


async def run(args: argparse.Namespace) -> Report:
    report = Report(
        "scheduling",
        "8. Scheduling: light users next to a heavy one; dispatch latency",
        args.tiny,
        params={
            "workers": args.worker_count,
            "slots_per_worker": args.slots,
            "tokens_per_answer": args.tokens,
            "token_delay_s": args.token_delay,
        },
    )
    table = Table(
        "Light users' time to first token while a heavy user's backlog waits; seconds",
        ["queue", "heavy answers", "light users", "TTFT p50", "p99", "max", "errors", "run s"],
    )
    for fair in (True, False):
        m = await one_run(args, fair)
        report.metrics["fair" if fair else "fifo"] = m
        table.rows.append(
            [
                "fair (VTC)" if fair else "first come first served",
                str(m["heavy_requests"]),
                str(m["light_users"]),
                f"{m['light_ttft_p50'] or 0:.2f}",
                f"{m['light_ttft_p99'] or 0:.2f}",
                f"{m['light_ttft_max'] or 0:.2f}",
                str(m["errors"]),
                f"{m['total_seconds']:.1f}",
            ]
        )
        print(f"{'fair' if fair else 'fifo'}: done", flush=True)
    report.tables.append(table)
    fair_p50 = report.metrics["fair"]["light_ttft_p50"]
    fifo_p50 = report.metrics["fifo"]["light_ttft_p50"]
    if fair_p50 is not None and fifo_p50 is not None:
        report.metrics["fifo_over_fair_p50"] = fifo_p50 / max(fair_p50, 1e-9)
        report.targets.append(
            Target(
                "light users behind a heavy one",
                "TTFT p50 far below first-come-first-served",
                f"{fair_p50:.2f} s fair vs {fifo_p50:.2f} s first come first served",
                fair_p50 < fifo_p50,
            )
        )
    # Part 2: dispatch latency, by dispatch_latency.py's own measurement.
    latency_args = argparse.Namespace(
        tiny=args.tiny, workers=None, samples=None, keep_logs=args.keep_logs, embedded=False
    )
    latency = await dispatch_latency.run(latency_args)
    report.tables.extend(latency.tables)
    report.targets.extend(latency.targets)
    report.metrics["dispatch_latency"] = latency.metrics
    report.notes.append(
        "The heavy user's answers are all queued before the light users ask; with fair queuing each light "
        "user's one answer goes ahead of the heavy user's backlog (it has received the fewest tokens), "
        "without it it waits for the whole backlog. Dispatch latency: see benchmark 3's notes."
    )
    return report


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--heavy", type=int, help="answers the heavy user queues")
    p.add_argument("--light", type=int, help="light users (one answer each)")
    p.add_argument("--worker-count", type=int, default=1)
    p.add_argument("--slots", type=int, default=2, help="max parallel requests per worker")
    p.add_argument("--tokens", type=int, default=20, help="tokens per answer")
    p.add_argument("--token-delay", type=float, default=0.01, help="seconds between the backend's tokens")
    main_wrapper(run, p.parse_args())


if __name__ == "__main__":
    main()
