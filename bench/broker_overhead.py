"""Benchmark 2: what the server costs with an instant backend, at 1, 10, 100 and 1,000 concurrent streams.

The same closed-loop load runs straight against the instant backend (POST /generate_stream) and through
server + worker + backend (chat API + server-sent events). Reported per level: time to first token
(p50/p99) on both paths and the added part, relayed tokens/s, tokens per CPU-second of the server
process, and the server's peak RSS (VmHWM).

    python -m bench.broker_overhead              # full: levels 1,10,100,1000, 100 tokens a stream
    python -m bench.broker_overhead --tiny       # CI: seconds
    python -m bench.broker_overhead --readers 4  # each answer read by 4 event streams at once
"""

from __future__ import annotations

import argparse
import math
import time

from bench.clients import OurApi, http_client, stream_tgi
from bench.load import closed_loop, login_users, prepare_ours, summarize
from bench.measure import cpu_seconds, diff, peak_rss_mb, ratio, rss_mb
from bench.report import Report, Table, Target, fmt_ratio, ms, num
from bench.script import int_list, main_wrapper, parser
from bench.stack import INSTANT_MODEL, BenchRun

SLOTS_PER_WORKER = 250
PROMPT = "Tell me a long story about a lighthouse keeper."


async def run(args: argparse.Namespace) -> Report:
    levels = args.levels or ([1, 10] if args.tiny else [1, 10, 100, 1000])
    tokens = args.tokens or (20 if args.tiny else 100)
    min_requests = args.min_requests or (6 if args.tiny else 40)
    readers = args.readers or 1
    report = Report(
        "broker_overhead",
        "2. Broker overhead with an instant backend",
        args.tiny,
        params={"levels": levels, "tokens_per_stream": tokens, "min_requests": min_requests},
    )
    top = max(levels)
    workers = args.workers or math.ceil(top / SLOTS_PER_WORKER)
    slots = min(SLOTS_PER_WORKER, max(2, math.ceil(top / workers)))
    with BenchRun("broker", keep_logs=args.keep_logs, embedded=args.embedded) as bench:
        backend = bench.start_instant_backend()
        server, worker_procs = bench.start_stack(backend, workers=workers, max_parallel=slots)
        report.params.update(
            workers=workers, slots_per_worker=slots, broker="in-process" if args.embedded else "redis"
        )
        if readers > 1:
            report.params.update(readers_per_stream=readers)
        table = Table(
            f"Concurrent streams of {tokens} tokens; TTFT in ms; tokens/s over the whole level",
            [
                "streams",
                "requests",
                "direct TTFT p50",
                "direct p99",
                "ours TTFT p50",
                "ours p99",
                "added p50",
                "added p99",
                "direct tok/s",
                "ours tok/s",
                "ours/direct",
                "tok per server CPU-s",
                "server CPU %",
                "worker CPU %",
                "server peak RSS MiB",
                "errors (ours)",
            ],
        )
        async with http_client(top * readers) as client:
            api = OurApi(client, server.url)
            users = await login_users(api, top, "broker")
            for level in levels:
                total = max(level, min_requests)
                # The direct path: the same closed loop straight to the backend.
                direct = summarize(
                    await closed_loop(level, total, lambda k, i: stream_tgi(client, backend, PROMPT, tokens))
                )
                # Our path: chats and prompts are made first, untimed; the timed part is
                # assistant_message + the event stream to its terminal event.
                timed = await prepare_ours([api], users, level, total, INSTANT_MODEL, tokens, PROMPT, readers)
                cpu0 = cpu_seconds(server.pid)
                wcpu0 = sum(cpu_seconds(w.proc.pid) for w in worker_procs)
                wall0 = time.perf_counter()
                results = await timed()
                wall = time.perf_counter() - wall0
                server_cpu = cpu_seconds(server.pid) - cpu0
                worker_cpu = sum(cpu_seconds(w.proc.pid) for w in worker_procs) - wcpu0
                ours = summarize(results)
                # A complete message whose stream missed tokens (its stored text is whole: the gap is
                # in what the reader saw).
                wrong = sum(
                    1
                    for r in results
                    if r.ok
                    and (
                        r.tokens != tokens or r.text != ((r.final or {}).get("message") or {}).get("content")
                    )
                )
                retried = sum(1 for r in results if r.retries)
                added50 = diff(ours.ttft_p(50), direct.ttft_p(50))
                added99 = diff(ours.ttft_p(99), direct.ttft_p(99))
                peak = peak_rss_mb(server.pid)
                per_cpu = ours.tokens / server_cpu if server_cpu > 0 else None
                table.rows.append(
                    [
                        str(level),
                        str(total),
                        ms(direct.ttft_p(50)),
                        ms(direct.ttft_p(99)),
                        ms(ours.ttft_p(50)),
                        ms(ours.ttft_p(99)),
                        ms(added50),
                        ms(added99),
                        num(direct.tokens_per_s),
                        num(ours.tokens_per_s),
                        fmt_ratio(ratio(ours.tokens_per_s, direct.tokens_per_s)),
                        num(per_cpu),
                        num(100 * server_cpu / wall),
                        num(100 * worker_cpu / wall),
                        num(peak),
                        ours.error_cell
                        + (f"; direct {direct.errors}" if direct.errors else "")
                        + (f"; {wrong} with gaps in the stream" if wrong else "")
                        + (f"; {retried} retried" if retried else ""),
                    ]
                )
                report.metrics[str(level)] = {
                    "direct_ttft_p50": direct.ttft_p(50),
                    "direct_ttft_p99": direct.ttft_p(99),
                    "ours_ttft_p50": ours.ttft_p(50),
                    "ours_ttft_p99": ours.ttft_p(99),
                    "added_ttft_p50": added50,
                    "added_ttft_p99": added99,
                    "direct_tokens_per_s": direct.tokens_per_s,
                    "ours_tokens_per_s": ours.tokens_per_s,
                    "tokens_per_server_cpu_s": per_cpu,
                    "server_cpu_s": server_cpu,
                    "worker_cpu_s": worker_cpu,
                    "server_peak_rss_mib": peak,
                    "server_rss_mib": rss_mb(server.pid),
                    "requests": total,
                    "tokens": ours.tokens,
                    "errors": ours.errors + direct.errors,
                    "refused": ours.rejected,
                    "wrong_token_counts": wrong,
                    "retried": retried,
                    "first_error": ours.first_error or direct.first_error,
                }
                if retried:
                    report.notes.append(
                        f"{level} streams: {retried} of our streams were retried on another worker (a 'retry' event)"
                    )
                for path, summary in (("direct", direct), ("ours", ours)):
                    report.note_failures(f"{level} streams, {path}", summary)
                print(f"level {level}: done ({ours.errors} errors)", flush=True)
    report.tables.append(table)
    _targets(report, levels)
    report.notes.append(
        "added TTFT = our p50 (p99) minus the direct p50 (p99) at the same concurrency; our TTFT runs from "
        "POST assistant_message to the first token event. Tokens per server CPU-second is the relay capacity "
        "of one server process when it has a core to itself."
    )
    return report


def _targets(report: Report, levels: list[int]) -> None:
    m = report.metrics
    if "100" in m:
        p50, p99 = m["100"]["added_ttft_p50"], m["100"]["added_ttft_p99"]
        report.targets.append(
            Target(
                "added TTFT at 100 streams (instant backend)",
                "p50 <= 5 ms, p99 <= 20 ms",
                f"p50 {ms(p50)} ms, p99 {ms(p99)} ms",
                None if p50 is None or p99 is None else p50 <= 0.005 and p99 <= 0.020,
            )
        )
    best = max((v["ours_tokens_per_s"] or 0 for v in m.values()), default=0)
    per_cpu = max((v["tokens_per_server_cpu_s"] or 0 for v in m.values()), default=0)
    report.targets.append(
        Target(
            "relayed tokens/s per server process",
            ">= 20,000",
            f"{num(best)} tok/s measured (wall); {num(per_cpu)} tok per server CPU-second",
            best >= 20_000,
        )
    )
    if "1000" in m:
        peak = m["1000"]["server_peak_rss_mib"]
        report.targets.append(
            Target(
                "1,000 concurrent streams on one process",
                "< 1 GiB RSS, no errors",
                f"peak RSS {num(peak)} MiB, {m['1000']['errors']} errors",
                peak < 1024 and m["1000"]["errors"] == 0,
            )
        )


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--levels", type=int_list, help="comma-separated concurrency levels")
    p.add_argument("--tokens", type=int, help="tokens per stream")
    p.add_argument("--min-requests", type=int, help="requests per level at least")
    p.add_argument("--workers", type=int, help="worker processes (default: one per 250 streams)")
    p.add_argument(
        "--readers", type=int, help="event streams reading each answer at once (default 1; tokens count once)"
    )
    main_wrapper(run, p.parse_args())


if __name__ == "__main__":
    main()
