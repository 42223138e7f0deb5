"""Benchmark 4: the same load through 1 and 2 server replicas, and through 1, 2 and 4 server processes.

The instant backend serves the workers. With one replica, every worker and client talks to it; with two,
the workers are split between the replicas and the clients alternate, so about half of the streams are
read on the replica that does not hold the worker's socket (their tokens cross through Redis). The
direct path is the same closed loop straight to the instant backend. Both phases use one fresh database and
key prefix; the second replica joins the first for phase two.

Then one server command with ``OASST_SERVER_PROCESSES=N`` (uvicorn's processes sharing one port) for N
= 1, 2 and 4, each on a fresh database and key prefix with its own workers, under the same load: relayed
tokens/s and the per-process efficiency (tokens/s at N over N times tokens/s at 1).

    python -m bench.scale_replicas              # full: 100 streams of 200 tokens, 400 requests
    python -m bench.scale_replicas --tiny       # CI: seconds
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

import httpx

from bench.clients import OurApi, http_client, stream_tgi
from bench.load import LoadSummary, closed_loop, login_users, prepare_ours, summarize
from bench.measure import cpu_seconds, peak_rss_mb, ratio, tree_pids
from bench.report import Report, Table, Target, fmt_ratio, ms, num
from bench.script import int_list, main_wrapper, parser
from bench.stack import INSTANT_MODEL, BenchRun
from tests.support.processes import wait_for_model

PROMPT = "Tell me about scaling out."


async def run(args: argparse.Namespace) -> Report:
    if args.embedded:
        raise SystemExit("replicas need the shared Postgres and Redis: run without --embedded")
    concurrency = args.concurrency or (4 if args.tiny else 100)
    tokens = args.tokens or (20 if args.tiny else 200)
    total = args.requests or (8 if args.tiny else 4 * concurrency)
    workers = 2
    counts = args.processes or ([1, 2] if args.tiny else [1, 2, 4])
    report = Report(
        "scale_replicas",
        "4. Scale: 1 vs 2 server replicas, and 1, 2, 4 server processes, sharing Postgres and Redis",
        args.tiny,
        params={
            "concurrency": concurrency,
            "tokens_per_stream": tokens,
            "requests": total,
            "workers": workers,
            "server_processes": counts,
        },
    )
    table = Table(
        f"{concurrency} concurrent streams of {tokens} tokens, {total} requests, {workers} workers",
        [
            "path",
            "tok/s",
            "vs 1 replica",
            "TTFT p50 ms",
            "TTFT p99 ms",
            "server CPU-s",
            "tok per server CPU-s",
            "peak RSS MiB (each)",
            "errors",
        ],
    )
    with BenchRun("scale", keep_logs=args.keep_logs) as bench:
        backend = bench.start_instant_backend()
        async with http_client(concurrency) as client:
            direct = summarize(
                await closed_loop(
                    concurrency, total, lambda k, i: stream_tgi(client, backend, PROMPT, tokens)
                )
            )
            table.rows.append(
                [
                    "direct (instant backend)",
                    num(direct.tokens_per_s),
                    "",
                    ms(direct.ttft_p(50)),
                    ms(direct.ttft_p(99)),
                    "",
                    "",
                    "",
                    str(direct.errors),
                ]
            )
            report.metrics["direct"] = {"tokens_per_s": direct.tokens_per_s, "errors": direct.errors}
            baseline = None
            database, prefix = bench.database(), bench.redis_prefix()
            servers = [bench.start_server(database, prefix)]
            slots = max(2, -(-concurrency // workers))
            procs = [
                bench.start_worker(servers[0].url, backend, model=INSTANT_MODEL, max_parallel=slots)
                for _ in range(workers)
            ]
            for replicas in (1, 2):
                if replicas == 2:
                    # A second replica on the same database and Redis; half the workers move to it.
                    servers.append(bench.start_server(database, prefix))
                    for w in range(1, workers, 2):
                        bench.stop(procs[w])
                        procs[w] = bench.start_worker(
                            servers[1].url, backend, model=INSTANT_MODEL, max_parallel=slots
                        )
                wait_for_model(servers[0].url, INSTANT_MODEL, workers=workers)
                apis = [OurApi(client, s.url) for s in servers]
                users = await login_users(apis[0], concurrency, f"scale{replicas}")
                timed = await prepare_ours(apis, users, concurrency, total, INSTANT_MODEL, tokens, PROMPT)
                cpu0 = [cpu_seconds(s.pid) for s in servers]
                wall0 = time.perf_counter()
                ours = summarize(await timed())
                wall = time.perf_counter() - wall0
                cpu = sum(cpu_seconds(s.pid) - c for s, c in zip(servers, cpu0, strict=True))
                if replicas == 1:
                    baseline = ours.tokens_per_s
                peaks = [peak_rss_mb(s.pid) for s in servers]
                label = f"{replicas} replica{'s' if replicas > 1 else ''}"
                table.rows.append([label, *_cells(ours, ratio(ours.tokens_per_s, baseline), cpu, peaks)])
                report.metrics[f"replicas_{replicas}"] = {
                    "tokens_per_s": ours.tokens_per_s,
                    "ttft_p50": ours.ttft_p(50),
                    "ttft_p99": ours.ttft_p(99),
                    "server_cpu_s": cpu,
                    "wall": wall,
                    "errors": ours.errors,
                    "first_error": ours.first_error,
                    "tokens": ours.tokens,
                }
                report.note_failures(f"{replicas} replica(s)", ours)
                print(f"{replicas} replica(s): done", flush=True)
            for process in [*procs, *(s.process for s in servers)]:  # idle, but they would answer pings
                bench.stop(process)
            await _processes(report, bench, client, backend, counts, concurrency, tokens, total, workers)
    report.tables.insert(0, table)  # the replicas' table first, as before
    report.metrics["scale_ratio"] = ratio(
        report.metrics["replicas_2"]["tokens_per_s"], report.metrics["replicas_1"]["tokens_per_s"]
    )
    report.notes.append(
        "all processes (replicas, workers, backend, load generator) share the machine's 2 cores: a second "
        "replica can only help while one server process is the bottleneck and a core is left."
    )
    return report


async def _processes(
    report: Report,
    bench: BenchRun,
    client: httpx.AsyncClient,
    backend: str,
    counts: list[int],
    concurrency: int,
    tokens: int,
    total: int,
    workers: int,
) -> None:
    """The same load through one server command of N processes (``OASST_SERVER_PROCESSES``), N in counts."""
    table = Table(
        f"OASST_SERVER_PROCESSES=N on one port: {concurrency} concurrent streams of {tokens} tokens, "
        f"{total} requests, {workers} workers",
        [
            "processes",
            "tok/s",
            "vs 1 process",
            "TTFT p50 ms",
            "TTFT p99 ms",
            "server CPU-s (all processes)",
            "tok per server CPU-s",
            "peak RSS MiB (each)",
            "errors",
            "per-process efficiency",
        ],
    )
    baseline = None
    for count in counts:
        server = bench.start_server(bench.database(), bench.redis_prefix(), OASST_SERVER_PROCESSES=str(count))
        _wait_ready(server.process.log_path, count)
        slots = max(2, -(-concurrency // workers))
        procs = [
            bench.start_worker(server.url, backend, model=INSTANT_MODEL, max_parallel=slots)
            for _ in range(workers)
        ]
        wait_for_model(server.url, INSTANT_MODEL, workers=workers)
        api = OurApi(client, server.url)
        users = await login_users(api, concurrency, f"processes{count}")
        timed = await prepare_ours([api], users, concurrency, total, INSTANT_MODEL, tokens, PROMPT)
        pids = _app_processes(server.pid) or [server.pid]  # one process: uvicorn runs the app itself
        cpu0 = sum(cpu_seconds(p) for p in pids)
        ours = summarize(await timed())
        cpu = sum(cpu_seconds(p) for p in pids) - cpu0
        if count == 1:
            baseline = ours.tokens_per_s
        scale = ratio(ours.tokens_per_s, baseline)
        efficiency = scale / count if scale is not None else None
        peaks = [peak_rss_mb(p) for p in pids if peak_rss_mb(p) > 0]
        table.rows.append([str(count), *_cells(ours, scale, cpu, peaks), fmt_ratio(efficiency)])
        report.metrics[f"processes_{count}"] = {
            "tokens_per_s": ours.tokens_per_s,
            "scale": scale,
            "efficiency": efficiency,
            "ttft_p50": ours.ttft_p(50),
            "server_cpu_s": cpu,
            "errors": ours.errors,
            "first_error": ours.first_error,
            "tokens": ours.tokens,
        }
        report.note_failures(f"{count} process(es)", ours)
        for proc in procs:
            bench.stop(proc)
        bench.stop(server.process)
        print(f"{count} process(es): done", flush=True)
    report.tables.append(table)
    measured = "; ".join(
        f"{c}: {num(report.metrics[f'processes_{c}']['tokens_per_s'])} tok/s "
        f"(efficiency {fmt_ratio(report.metrics[f'processes_{c}']['efficiency'])})"
        for c in counts
    )
    errors = sum(report.metrics[f"processes_{c}"]["errors"] for c in counts)
    report.targets.append(
        Target(
            "several server processes on one host (OASST_SERVER_PROCESSES)",
            "relayed tokens/s at 1, 2, 4 processes and the per-process efficiency reported, no error",
            f"{measured}; the machine has 2 cores",
            errors == 0,
        )
    )
    report.notes.append(
        "per-process efficiency = tokens/s at N processes / (N x tokens/s at 1). The machine has 2 cores, "
        "shared by the processes, the workers, the backend and the load generator: past 2 processes no gain "
        "is possible here, and even 2 processes compete with everything else."
    )


def _cells(summary: LoadSummary, scale: float | None, cpu: float, peaks: list[float]) -> list[str]:
    """A load's cells: tok/s, against the baseline, TTFT p50 and p99, server CPU, tokens per CPU-second,
    peak RSS of each process, errors."""
    return [
        num(summary.tokens_per_s),
        fmt_ratio(scale),
        ms(summary.ttft_p(50)),
        ms(summary.ttft_p(99)),
        num(cpu, 1),
        num(summary.tokens / cpu if cpu > 0 else None),
        " / ".join(num(p) for p in peaks),
        str(summary.errors),
    ]


def _app_processes(supervisor: int) -> list[int]:
    """The app processes uvicorn's supervisor spawned (not its other children, such as multiprocessing's
    resource tracker)."""
    found = []
    for pid in tree_pids(supervisor):
        with contextlib.suppress(OSError):
            if b"multiprocessing.spawn" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return found


def _wait_ready(log_path: Path, count: int, timeout: float = 90) -> None:
    """Wait until ``count`` server processes logged that they are ready."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log_path.read_text(errors="replace").count("inference server ready") >= count:
            return
        time.sleep(0.2)
    raise RuntimeError(f"fewer than {count} server processes became ready")


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int)
    p.add_argument("--tokens", type=int, help="tokens per stream")
    p.add_argument("--requests", type=int)
    p.add_argument(
        "--processes", type=int_list, help="OASST_SERVER_PROCESSES values (default 1,2,4; tiny 1,2)"
    )
    main_wrapper(run, p.parse_args())


if __name__ == "__main__":
    main()
