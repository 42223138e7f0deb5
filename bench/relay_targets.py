"""Benchmark 7: the relay's targets, each path beside the bare relay and the LiteLLM proxy (instant backend).

In one run, against the same instant backend:

* **added time to first token at one stream**: one request at a time, in rounds; each round sends one
  request on every path (in a rotating order): straight to the backend's OpenAI API, through the bare
  relay (bench/bare_relay.py), through LiteLLM, through our ``/v1/chat/completions``, through our chat
  API in three requests (``prompter_message``, ``assistant_message``, ``.../events``, timed from the first
  POST) and through our one-request ``POST /chats/{id}/turns``. Added = a path's TTFT minus the direct
  path's, at p50 (and p99).
* **relayed tokens per CPU-second of the relaying process**: a closed loop of streams of 100 and of 1,000
  tokens through the bare relay, LiteLLM, our ``/v1`` and our chat API (three requests a turn; the chats
  are made beforehand). The CPU counted is the relay's process: the bare relay's, LiteLLM's (with its
  children), our server's (the worker's beside it).

For every target not met, its scenario runs once more while py-spy samples our server and worker
(bench/profile_hot_path.py), and the top of each profile goes into the report: what limits it.

Tiny mode (CI) skips LiteLLM (its install takes minutes) and profiles one unmet scenario only.

    python -m bench.relay_targets              # full
    python -m bench.relay_targets --tiny       # CI: seconds, without LiteLLM
    python -m bench.relay_targets --cpu-only   # the tokens per CPU-second alone (a few minutes)
    python -m bench.relay_targets --skip-litellm --ttft-only --rounds 50   # the one-stream TTFT alone
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.clients import OurApi, StreamResult, http_client, stream_openai
from bench.litellm_compare import DEFAULT_VENV, ensure_litellm, start_litellm
from bench.load import LoadSummary, closed_loop, login_users, summarize, until
from bench.measure import cpu_seconds, diff, ratio, tree_pids
from bench.profile_hot_path import profile_during, py_spy, report_profiles
from bench.report import Report, Table, Target, fmt_ratio, ms, num, signed_ms
from bench.script import main_wrapper, parser
from bench.stack import INSTANT_MODEL, BenchRun

PROMPT = "Tell me a long story about a lighthouse keeper."
MESSAGES = [{"role": "user", "content": PROMPT}]
CHAT_API = "ours, chat API (3 requests)"
TURNS = "ours, POST /chats/{id}/turns"
OURS_V1 = "ours, /v1/chat/completions"
BARE = "bare relay"
LITELLM = "LiteLLM"
DIRECT = "direct"
# Which of our paths the per-CPU targets are measured on, and the goal of each (tokens per stream, path).
CPU_GOALS = {
    (100, CHAT_API): 15_000,
    (100, OURS_V1): 20_000,
    (1000, CHAT_API): 40_000,
    (1000, OURS_V1): 40_000,
}

Request = Callable[[int, int], Awaitable[StreamResult]]


@dataclass
class ChatSupply:
    """Chats made before a timed part, one list per user; a timed request takes one (or makes one late)."""

    api: OurApi
    users: list[str]
    chats: list[list[str]] = field(default_factory=list)

    async def fill(self, per_user: int) -> None:
        async def make(user: str) -> list[str]:
            return [await self.api.create_chat(user) for _ in range(per_user)]

        self.chats = list(await asyncio.gather(*(make(u) for u in self.users)))

    async def take(self, k: int) -> str:
        if self.chats and self.chats[k]:
            return self.chats[k].pop()
        return await self.api.create_chat(self.users[k])


@dataclass
class Paths:
    """Every path's request function and the processes whose CPU it spends."""

    requests: dict[str, Request]
    pids: dict[str, list[int]]


def _paths(
    client: httpx.AsyncClient,
    api: OurApi,
    supply: ChatSupply,
    backend: str,
    bare: str,
    litellm: tuple[str, str] | None,
    tokens: int,
) -> dict[str, Request]:
    users = supply.users

    async def chat_api(k: int, i: int) -> StreamResult:
        chat_id = await supply.take(k)
        return await api.prompt_and_ask(users[k], chat_id, PROMPT, INSTANT_MODEL, tokens)

    async def turns(k: int, i: int) -> StreamResult:
        chat_id = await supply.take(k)
        return await api.turn(users[k], chat_id, PROMPT, INSTANT_MODEL, tokens)

    paths: dict[str, Request] = {
        DIRECT: lambda k, i: stream_openai(client, backend, INSTANT_MODEL, MESSAGES, tokens),
        BARE: lambda k, i: stream_openai(client, bare, INSTANT_MODEL, MESSAGES, tokens),
    }
    if litellm is not None:
        url, key = litellm
        paths[LITELLM] = lambda k, i: stream_openai(client, url, INSTANT_MODEL, MESSAGES, tokens, key)
    paths[OURS_V1] = lambda k, i: stream_openai(client, api.base, INSTANT_MODEL, MESSAGES, tokens, users[k])
    paths[CHAT_API] = chat_api
    paths[TURNS] = turns
    return paths


async def measure_ttft(paths: dict[str, Request], rounds: int) -> dict[str, list[StreamResult]]:
    """``rounds`` rounds of one request per path, one request at a time, in a rotating order."""
    names = list(paths)
    results: dict[str, list[StreamResult]] = {name: [] for name in names}
    for r in range(rounds):
        for j in range(len(names)):
            name = names[(r + j) % len(names)]
            results[name].append(await paths[name](0, r))
    return results


@dataclass
class CpuRun:
    summary: LoadSummary
    relay_cpu: float
    worker_cpu: float | None

    @property
    def tokens_per_cpu_s(self) -> float | None:
        return self.summary.tokens / self.relay_cpu if self.relay_cpu > 0 else None


async def measure_cpu(
    request: Request, relay_pids: list[int], worker_pid: int | None, concurrency: int, total: int
) -> CpuRun:
    cpu0 = sum(cpu_seconds(p) for p in relay_pids)
    wcpu0 = cpu_seconds(worker_pid) if worker_pid else 0.0
    summary = summarize(await closed_loop(concurrency, total, request))
    relay_cpu = sum(cpu_seconds(p) for p in relay_pids) - cpu0
    worker_cpu = cpu_seconds(worker_pid) - wcpu0 if worker_pid else None
    return CpuRun(summary, relay_cpu, worker_cpu)


async def run(args: argparse.Namespace) -> Report:
    rounds = args.rounds or (3 if args.tiny else 60)
    ttft_tokens = 20
    concurrency = args.concurrency or (2 if args.tiny else 20)
    lengths = [100, 200] if args.tiny else [100, 1000]
    requests = {lengths[0]: 4 if args.tiny else 400, lengths[1]: 4 if args.tiny else 60}
    profile_seconds = args.profile_seconds or (1.0 if args.tiny else 8.0)
    use_litellm = not args.tiny and not args.skip_litellm and not args.cpu_only
    report = Report(
        "relay_targets",
        "7. The relay's targets: ours beside the bare relay and LiteLLM (instant backend)",
        args.tiny,
        params={
            "ttft_rounds": rounds,
            "ttft_tokens": ttft_tokens,
            "concurrency": concurrency,
            "tokens_per_stream": lengths,
            "requests": {f"{n} tokens": r for n, r in requests.items()},
        },
    )
    if not use_litellm:
        report.notes.append(
            "LiteLLM skipped (tiny mode or --skip-litellm): the targets against it are not judged"
        )
    with BenchRun("targets", keep_logs=args.keep_logs, embedded=args.embedded) as bench:
        backend = bench.start_instant_backend()
        bare_url, bare_pid = bench.start_bare_relay(backend)
        litellm: tuple[str, str] | None = None
        litellm_pids: list[int] = []
        if use_litellm:
            exe, version = ensure_litellm(args.litellm_venv)
            report.params["litellm_version"] = version
            key = f"sk-bench-{uuid.uuid4().hex}"
            url, pid = start_litellm(bench, exe, backend, key)
            litellm, litellm_pids = (url, key), tree_pids(pid)
        server, (worker,) = bench.start_stack(backend, max_parallel=max(2, concurrency))
        relay_pids = {BARE: [bare_pid], LITELLM: litellm_pids, OURS_V1: [server.pid], CHAT_API: [server.pid]}
        async with http_client(concurrency) as client:
            api = OurApi(client, server.url)
            users = await login_users(api, concurrency + 1, f"targets-{uuid.uuid4().hex[:6]}")
            ttft_user, load_users = users[:1], users[1:]
            # Warm every path (imports, connection pools, LiteLLM's clients) before timing.
            warm = ChatSupply(api, ttft_user)
            for request in _paths(client, api, warm, backend, bare_url, litellm, 4).values():
                await request(0, 0)

            # ---------------------------------------------------------- TTFT at one stream
            if not args.cpu_only:
                supply = ChatSupply(api, ttft_user)
                await supply.fill(2 * rounds)
                ttft = await measure_ttft(
                    _paths(client, api, supply, backend, bare_url, litellm, ttft_tokens), rounds
                )
                print("time to first token: done", flush=True)
                _ttft_report(report, {name: summarize(results) for name, results in ttft.items()})
                if args.ttft_only:
                    return report

            # ---------------------------------------------------------- tokens per CPU-second
            cpu_runs: dict[tuple[int, str], CpuRun] = {}
            for tokens in lengths:
                total = requests[tokens]
                supply = ChatSupply(api, load_users)
                await supply.fill(-(-total // concurrency))
                paths = _paths(client, api, supply, backend, bare_url, litellm, tokens)
                for name in (BARE, LITELLM, OURS_V1, CHAT_API):
                    if name not in paths:
                        continue
                    worker_pid = worker.proc.pid if name in (OURS_V1, CHAT_API) else None
                    cpu_runs[tokens, name] = await measure_cpu(
                        paths[name], relay_pids[name], worker_pid, concurrency, total
                    )
                print(f"{tokens}-token streams: done", flush=True)
            _cpu_report(report, cpu_runs, concurrency)

            # ---------------------------------------------------------- profiles of unmet targets
            if args.cpu_only:
                return report
            await _profile_unmet(
                report,
                args,
                bench.log_dir,
                {"server": server.pid, "worker": worker.proc.pid},
                api,
                lambda tokens, supply: _paths(client, api, supply, backend, bare_url, litellm, tokens),
                ttft_user,
                load_users,
                concurrency,
                profile_seconds,
                limit=1 if args.tiny else None,
            )
    return report


def _ttft_report(report: Report, summaries: dict[str, LoadSummary]) -> None:
    direct = summaries[DIRECT]
    table = Table(
        "One stream at a time: POST to the first token, ms (each path once per round)",
        ["path", "requests", "TTFT p50", "TTFT p99", "added p50", "added p99", "errors"],
    )
    metrics: dict[str, dict[str, float | int | str | None]] = {}
    for name, summary in summaries.items():
        added50 = diff(summary.ttft_p(50), direct.ttft_p(50))
        added99 = diff(summary.ttft_p(99), direct.ttft_p(99))
        table.rows.append(
            [
                name,
                str(summary.requests),
                ms(summary.ttft_p(50), 2),
                ms(summary.ttft_p(99), 2),
                "" if name == DIRECT else signed_ms(added50, 2),
                "" if name == DIRECT else signed_ms(added99, 2),
                str(summary.errors),
            ]
        )
        metrics[name] = {
            "ttft_p50": summary.ttft_p(50),
            "ttft_p99": summary.ttft_p(99),
            "added_ttft_p50": added50,
            "added_ttft_p99": added99,
            "errors": summary.errors,
            "first_error": summary.first_error,
        }
        report.note_failures(f"time to first token, {name}", summary)
    report.tables.append(table)
    report.metrics["ttft"] = metrics
    peer = metrics.get(LITELLM, {}).get("added_ttft_p50")
    bare = metrics[BARE]["added_ttft_p50"]
    for name, goal, label in (
        (OURS_V1, 0.005, "/v1/chat/completions (streaming)"),
        (CHAT_API, 0.008, "chat API (prompter_message, assistant_message, events)"),
    ):
        added = metrics[name]["added_ttft_p50"]
        measured = f"+{ms(added)} ms p50 (LiteLLM {_plus(peer)}, bare relay {_plus(bare)})"
        if name == CHAT_API:
            measured += f"; one request (POST /chats/{{id}}/turns) {_plus(metrics[TURNS]['added_ttft_p50'])}"
        met = None
        if isinstance(added, float) and isinstance(peer, float):
            met = added <= goal and added < peer
        report.targets.append(
            Target(
                f"added TTFT at one stream, {label}",
                f"p50 <= {goal * 1000:.0f} ms and below LiteLLM's",
                measured,
                met,
            )
        )


def _plus(seconds: object) -> str:
    return f"+{ms(seconds)} ms" if isinstance(seconds, float) else "n/a"


def _cpu_report(report: Report, runs: dict[tuple[int, str], CpuRun], concurrency: int) -> None:
    table = Table(
        f"{concurrency} concurrent streams (closed loop); CPU of the relaying process",
        [
            "tokens a stream",
            "path",
            "requests",
            "tok/s (wall)",
            "relay CPU-s",
            "tok per relay CPU-s",
            "vs bare relay",
            "tok per worker CPU-s",
            "errors",
        ],
    )
    metrics: dict[str, dict[str, float | int | str | None]] = {}
    for (tokens, name), cpu_run in runs.items():
        bare = runs.get((tokens, BARE))
        per_cpu = cpu_run.tokens_per_cpu_s
        worker_per_cpu = cpu_run.summary.tokens / cpu_run.worker_cpu if cpu_run.worker_cpu else None
        table.rows.append(
            [
                str(tokens),
                name,
                str(cpu_run.summary.requests),
                num(cpu_run.summary.tokens_per_s),
                num(cpu_run.relay_cpu, 1),
                num(per_cpu),
                fmt_ratio(ratio(per_cpu, bare.tokens_per_cpu_s if bare else None)),
                num(worker_per_cpu),
                str(cpu_run.summary.errors),
            ]
        )
        metrics[f"{tokens}_{name}"] = {
            "tokens": cpu_run.summary.tokens,
            "requests": cpu_run.summary.requests,
            "tokens_per_s": cpu_run.summary.tokens_per_s,
            "relay_cpu_s": cpu_run.relay_cpu,
            "tokens_per_relay_cpu_s": per_cpu,
            "tokens_per_worker_cpu_s": worker_per_cpu,
            "errors": cpu_run.summary.errors,
            "first_error": cpu_run.summary.first_error,
        }
        report.note_failures(f"{tokens}-token streams, {name}", cpu_run.summary)
    report.tables.append(table)
    report.metrics["cpu"] = metrics
    lengths = sorted({tokens for tokens, _ in runs})
    short, long = lengths[0], lengths[-1]

    def per(tokens: int, name: str) -> float | None:
        run = runs.get((tokens, name))
        return run.tokens_per_cpu_s if run and not run.summary.errors else None

    def peers(tokens: int) -> str:
        return f"bare relay {num(per(tokens, BARE))}, LiteLLM {num(per(tokens, LITELLM))}"

    for name, goal in ((CHAT_API, CPU_GOALS[100, CHAT_API]), (OURS_V1, CPU_GOALS[100, OURS_V1])):
        value = per(short, name)
        api = "chat API (3 requests a turn)" if name == CHAT_API else "/v1/chat/completions"
        report.targets.append(
            Target(
                f"relayed tokens per server CPU-second, {short}-token streams, {api}",
                f">= {goal:,}",
                f"{num(value)} ({peers(short)})",
                None if value is None else value >= goal,
            )
        )
    chat, v1 = per(long, CHAT_API), per(long, OURS_V1)
    goal = CPU_GOALS[1000, CHAT_API]
    report.targets.append(
        Target(
            f"relayed tokens per server CPU-second, {long}-token streams",
            f">= {goal:,} (the bare relay's level)",
            f"chat API {num(chat)}, /v1 {num(v1)} ({peers(long)})",
            None if chat is None or v1 is None else min(chat, v1) >= goal,
        )
    )


# Each unmet target's scenario to profile: (target, path, tokens a stream, concurrent, processes). The
# per-CPU targets are the server's alone; the first token waits on the worker too.
def _scenarios(report: Report, lengths: list[int]) -> list[tuple[str, str, int, bool, tuple[str, ...]]]:
    out = []
    both, server = ("server", "worker"), ("server",)
    for target in report.targets:
        if target.met is not False:
            continue
        name = target.name
        if name.startswith("added TTFT") and "/v1" in name:
            out.append((name, OURS_V1, 20, False, both))
        elif name.startswith("added TTFT"):
            out.append((name, CHAT_API, 20, False, both))
        elif "chat API" in name:
            out.append((name, CHAT_API, lengths[0], True, server))
        elif "/v1" in name:
            out.append((name, OURS_V1, lengths[0], True, server))
        else:
            out.append((name, CHAT_API, lengths[-1], True, server))
    return out


async def _profile_unmet(
    report: Report,
    args: argparse.Namespace,
    log_dir: Path,
    pids: dict[str, int],
    api: OurApi,
    make_paths: Callable[[int, ChatSupply], dict[str, Request]],
    ttft_user: list[str],
    load_users: list[str],
    concurrency: int,
    seconds: float,
    limit: int | None,
) -> None:
    lengths = [int(t) for t in report.params["tokens_per_stream"]]
    scenarios = _scenarios(report, lengths)[:limit]
    if not scenarios:
        return
    spy = py_spy()
    if spy is None:
        report.notes.append("py-spy is not installed: the unmet targets are not profiled")
        return
    profiles: dict[str, dict[str, object]] = {}
    for target, path, tokens, concurrent, profiled in scenarios:
        users = load_users if concurrent else ttft_user
        supply = ChatSupply(api, users)
        if path in (CHAT_API, TURNS):  # the chats its requests take, made before the sampling
            await supply.fill(int(seconds / 0.03) if not concurrent else 30)
        request = make_paths(tokens, supply)[path]
        workers = len(users)
        results: list[StreamResult] = []

        async def drive(
            deadline: float,
            request: Request = request,
            tasks: int = workers,
            results: list[StreamResult] = results,
        ) -> None:
            results.extend(await until(deadline, request, tasks))

        chosen = {name: pid for name, pid in pids.items() if name in profiled}
        sampled = await profile_during(spy, chosen, seconds, args.rate, log_dir, drive)
        load = summarize(results)
        scenario = f"{path}, {tokens}-token streams, {workers} at a time"
        entry: dict[str, object] = {"scenario": scenario, "requests": load.requests, "errors": load.errors}
        entry |= report_profiles(report, sampled, f"What limits '{target}'", scenario)
        profiles[target] = entry
    report.metrics["profiles"] = profiles


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, help="rounds of the one-stream TTFT measurement")
    p.add_argument("--concurrency", type=int, help="concurrent streams of the CPU measurement")
    p.add_argument("--profile-seconds", type=float, help="seconds of py-spy sampling per unmet target")
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--skip-litellm", action="store_true")
    only = p.add_mutually_exclusive_group()
    only.add_argument(
        "--cpu-only",
        action="store_true",
        help="only the tokens per CPU-second (ours and the bare relay): no TTFT rounds, LiteLLM or profiles",
    )
    only.add_argument(
        "--ttft-only",
        action="store_true",
        help="only the one-stream TTFT measurement (no CPU runs, no profiles)",
    )
    p.add_argument("--litellm-venv", type=Path, default=DEFAULT_VENV)
    main_wrapper(run, p.parse_args())


if __name__ == "__main__":
    main()
