"""Benchmark: tokens at the model's pace: what each relayed token costs each process, beside a bare relay.

The instant backend paced like a batching model (``--token-rate``: one token per write, every stream's next
token at the next tick of one shared clock, 25 a second by default) serves N concurrent streams of
100-token answers (100 and 1,000 streams; tiny mode: 20 of 20 tokens), on every path in turn:

* **bare relay** (the yardstick): one FastAPI + httpx process that reads the backend's TGI stream (the
  one our worker reads) and turns each event into an OpenAI chunk: a parse, an encode and a write a token;
* **bare relay, pass-through**: the same process passing the backend's OpenAI bytes through unparsed;
* **LiteLLM** (full mode only), proxying the backend's OpenAI stream (its own CPU and its children's);
* **ours, /v1**: ``POST /v1/chat/completions`` streamed through our server and worker;
* **ours, chat API**: a turn in three requests (``prompter_message``, ``assistant_message``, ``events``;
  the chats are made beforehand).

Each measurement staggers the N streams' starts over one answer's time, waits until all run, then reads
every process's CPU time (/proc) across a window while the streams go on back to back; the tokens relayed
in the window are counted from each stream's first and last token's arrival (the tokens come evenly in
between). Each process's idle CPU (measured before, with nothing streaming) is subtracted. The paths are
alternated (their order rotates from one repetition to the next) and the figures add up the repetitions.
Reported per path: CPU per relayed token of each process (µs), tokens per CPU-second, the ratio to the bare
relay, the pace the streams kept (tokens a second a stream, as the load generator saw them), errors. A pace far below the asked one means
the machine could not keep up: tokens then bunch, and per-token figures flatter every path.

Then the real model (the bundled CPU backend with SmolLM2, full mode only): a few streams on the bare relay,
ours /v1 and our chat API, measured the same way. Last, py-spy samples the server and the worker under the
paced load of /v1 (and of the chat API in full mode) and the top of each profile goes into the report.

    python -m bench.paced_relay                  # full (LiteLLM installed into a throwaway venv)
    python -m bench.paced_relay --tiny           # CI: about a minute, no LiteLLM, no real model; the CPU and
                                                 # tokens of each whole run rather than of a window
    python -m bench.paced_relay --levels 100 --rate 25 --window 10 --skip-litellm --skip-model
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.clients import OurApi, StreamResult, http_client, stream_openai
from bench.litellm_compare import DEFAULT_VENV, ensure_litellm, start_litellm
from bench.load import login_users, summarize, until
from bench.measure import cpu_seconds, median, ratio, tree_pids
from bench.profile_hot_path import profile_during, py_spy, report_profiles
from bench.relay_targets import ChatSupply
from bench.report import Report, Table, Target, fmt_ratio, num
from bench.script import int_list, main_wrapper, parser
from bench.stack import INSTANT_MODEL, BenchRun, Server
from tests.support.processes import ManagedProcess, wait_for_model
from tests.support.stacks import MODEL_NAME

PROMPT = "Tell me a long story about a lighthouse keeper."
MESSAGES = [{"role": "user", "content": PROMPT}]
BARE = "bare relay (TGI -> OpenAI)"
PASS = "bare relay, pass-through"
LITELLM = "LiteLLM"
OURS_V1 = "ours, /v1"
CHAT_API = "ours, chat API"
OURS = (OURS_V1, CHAT_API)
# The targets of issue 29: server + worker CPU per token against the bare relay's, and the worker's alone.
GOALS = {OURS_V1: 1.5, CHAT_API: 2.0}
WORKER_GOAL = 0.3
WORKER_SLOTS = 256  # the most a worker takes (OASST_WORKER_MAX_PARALLEL_REQUESTS)
MAX_USERS = 100  # the streams share this many users (the per-user limits are off in the benchmarks)

Request = Callable[[int, int], Awaitable[StreamResult]]


@dataclass
class Level:
    streams: int
    rate: float  # tokens a second a stream, asked of the backend
    tokens: int  # tokens an answer

    @property
    def answer_seconds(self) -> float:
        return self.tokens / self.rate


@dataclass
class Window:
    """One path measured once: the tokens relayed in the window and each process's CPU in it."""

    tokens: float
    wall: float
    cpu: dict[str, float]  # idle subtracted
    results: list[StreamResult]
    pace: float | None  # median tokens a second a stream, of the streams in the window


@dataclass
class PathRuns:
    """A path's windows at one level, added up."""

    processes: tuple[str, ...]
    windows: list[Window] = field(default_factory=list)

    @property
    def tokens(self) -> float:
        return sum(w.tokens for w in self.windows)

    def cpu(self, name: str) -> float:
        return sum(w.cpu.get(name, 0.0) for w in self.windows)

    def us_per_token(self, *names: str) -> float | None:
        names = names or self.processes
        tokens = self.tokens
        return 1e6 * sum(self.cpu(n) for n in names) / tokens if tokens > 0 else None

    def spread(self) -> tuple[float, float] | None:
        """The lowest and highest µs per token (all the path's processes) of its windows."""
        values = [
            1e6 * sum(w.cpu.get(n, 0.0) for n in self.processes) / w.tokens
            for w in self.windows
            if w.tokens > 0
        ]
        return (min(values), max(values)) if values else None

    @property
    def errors(self) -> int:
        return sum(1 for w in self.windows for r in w.results if not r.ok)

    @property
    def requests(self) -> int:
        return sum(len(w.results) for w in self.windows)

    @property
    def first_error(self) -> str | None:
        return next((r.error for w in self.windows for r in w.results if not r.ok), None)

    @property
    def pace(self) -> float | None:
        return median([w.pace for w in self.windows if w.pace is not None])


def tokens_in(result: StreamResult, t0: float, t1: float) -> float:
    """The tokens of a stream that arrived between t0 and t1 (evenly spread from its first to its last)."""
    first, last = result.first_token, result.last_token
    if first is None or last is None or result.tokens == 0:
        return 0.0
    if last <= first:
        return float(result.tokens) if t0 <= first <= t1 else 0.0
    overlap = min(last, t1) - max(first, t0)
    return result.tokens * overlap / (last - first) if overlap > 0 else 0.0


class Cpu:
    """The CPU time of named processes (a process and its children where asked), idle rate subtracted."""

    def __init__(self, pids: dict[str, list[int]]):
        self.pids = pids
        self.idle: dict[str, float] = {}  # CPU-seconds per second with nothing streaming

    def read(self) -> dict[str, float]:
        return {name: sum(cpu_seconds(p) for p in pids) for name, pids in self.pids.items()}

    async def measure_idle(self, seconds: float) -> None:
        before = self.read()
        await asyncio.sleep(seconds)
        after = self.read()
        self.idle = {name: max(0.0, (after[name] - before[name]) / seconds) for name in after}

    def busy(self, before: dict[str, float], after: dict[str, float], wall: float) -> dict[str, float]:
        return {
            name: max(0.0, after[name] - before[name] - self.idle.get(name, 0.0) * wall) for name in after
        }


async def paced_window(
    request: Request, level: Level, cpu: Cpu, stagger: float, window: float, *, whole: bool = False
) -> Window:
    """``level.streams`` streams back to back, their starts spread over ``stagger`` seconds; the CPU of every
    process across ``window`` seconds once all run. New streams stop at the window's end; the ones open then
    finish before this returns. ``whole`` (tiny mode): the CPU and the tokens of the whole run instead, from
    before the first request to the last stream's end (a slow machine cannot leave the window empty)."""
    start = time.perf_counter()
    t0 = start + stagger + min(1.0, level.answer_seconds / 4)
    t1 = t0 + window
    streams = until(t1, request, level.streams, stagger=stagger, clock=time.perf_counter)

    async def marks() -> tuple[dict[str, float], dict[str, float], float]:
        await asyncio.sleep(max(0.0, t0 - time.perf_counter()))
        before, w0 = cpu.read(), time.perf_counter()
        await asyncio.sleep(max(0.0, t1 - time.perf_counter()))
        after, w1 = cpu.read(), time.perf_counter()
        return before, after, w1 - w0

    if whole:
        before = cpu.read()
        results = await streams
        after, end = cpu.read(), time.perf_counter()
        w0, t1, wall = start, end, end - start
    else:
        (before, after, wall), results = await asyncio.gather(marks(), streams)
        w0 = t1 - wall
    tokens = sum(tokens_in(r, w0, t1) for r in results)
    paces = [
        r.decode_rate
        for r in results
        if r.ok
        and r.decode_rate
        and r.first_token
        and r.last_token
        and r.first_token < t1
        and r.last_token > w0
    ]
    return Window(tokens, wall, cpu.busy(before, after, wall), results, median(paces))


def make_paths(
    client: httpx.AsyncClient,
    api: OurApi,
    supply: ChatSupply,
    urls: dict[str, tuple[str, str | None]],
    model: str,
    tokens: int,
) -> dict[str, Request]:
    """Each path's request: ``urls`` holds the OpenAI-speaking ones (URL, key) and, under OURS_V1, the
    server's URL; users are shared by the streams (stream k is user k % users)."""
    users = supply.users
    paths: dict[str, Request] = {}
    for name, (url, key) in urls.items():
        if name == OURS_V1:
            continue
        paths[name] = lambda k, i, url=url, key=key: stream_openai(client, url, model, MESSAGES, tokens, key)

    async def v1(k: int, i: int) -> StreamResult:
        return await stream_openai(client, api.base, model, MESSAGES, tokens, users[k % len(users)])

    async def chat_api(k: int, i: int) -> StreamResult:
        user = k % len(users)
        chat_id = await supply.take(user)
        return await api.prompt_and_ask(users[user], chat_id, PROMPT, model, tokens)

    paths[OURS_V1] = v1
    paths[CHAT_API] = chat_api
    return paths


async def measure_paths(
    label: str,
    paths: dict[str, Request],
    processes: dict[str, tuple[str, ...]],
    level: Level,
    cpu: Cpu,
    reps: int,
    window: float,
    whole: bool = False,
) -> dict[str, PathRuns]:
    """Every path ``reps`` times, alternated (the order rotates by one each repetition)."""
    names = list(paths)
    runs = {name: PathRuns(processes[name]) for name in names}
    stagger = min(level.answer_seconds, 5.0)
    for rep in range(reps):
        for j in range(len(names)):
            name = names[(rep + j) % len(names)]
            measured = await paced_window(paths[name], level, cpu, stagger, window, whole=whole)
            runs[name].windows.append(measured)
            us = (
                1e6 * sum(measured.cpu[p] for p in processes[name]) / measured.tokens
                if measured.tokens
                else None
            )
            errors = sum(1 for r in measured.results if not r.ok)
            print(
                f"{label}, {name}: {measured.tokens:,.0f} tokens in {measured.wall:.1f} s, {num(us)} µs a token, "
                f"pace {num(measured.pace, 1)} tok/s a stream, {errors} errors "
                f"(load {os.getloadavg()[0]:.2f})",
                flush=True,
            )
            await asyncio.sleep(1.0)  # let the last streams' tails settle
    return runs


async def run(args: argparse.Namespace) -> Report:
    tokens = args.tokens or (20 if args.tiny else 100)
    levels = [Level(n, args.rate, tokens) for n in (args.levels or ([20] if args.tiny else [100, 1000]))]
    window = args.window or (2.0 if args.tiny else 10.0)
    reps = args.reps or (1 if args.tiny else 2)
    idle_seconds = 1.0 if args.tiny else 3.0
    use_litellm = not args.tiny and not args.skip_litellm
    use_model = not args.tiny and not args.skip_model
    profile_seconds = args.profile_seconds or (1.0 if args.tiny else 8.0)
    report = Report(
        "paced_relay",
        "7b. Tokens at the model's pace: CPU per relayed token of each process, beside the bare relay and LiteLLM",
        args.tiny,
        params={
            "streams": [level.streams for level in levels],
            "tokens_a_second_a_stream": args.rate,
            "tokens_per_answer": tokens,
            "window_s": window,
            "repetitions": reps,
            "idle_s": idle_seconds,
            "db_pool": args.db_pool or "the server's default",
        },
    )
    if not use_litellm:
        report.notes.append("LiteLLM skipped (tiny mode or --skip-litellm)")
    loads: list[float] = []
    runs: dict[tuple[str, int], dict[str, PathRuns]] = {}
    with BenchRun("paced", keep_logs=args.keep_logs, embedded=args.embedded) as bench:
        backend = bench.start_instant_backend(token_rate=args.rate)
        bare_url, bare_pid = bench.start_bare_relay(backend, upstream="tgi")
        pass_url, pass_pid = bench.start_bare_relay(backend, upstream="openai")
        urls: dict[str, tuple[str, str | None]] = {BARE: (bare_url, None), PASS: (pass_url, None)}
        pids: dict[str, list[int]] = {BARE: [bare_pid], PASS: [pass_pid]}
        if use_litellm:
            exe, version = ensure_litellm(args.litellm_venv)
            report.params["litellm_version"] = version
            key = f"sk-bench-{uuid.uuid4().hex}"
            url, pid = start_litellm(bench, exe, backend, key)
            urls[LITELLM] = (url, key)
            pids[LITELLM] = tree_pids(pid)
        most = max(level.streams for level in levels)
        server, workers = _stack(bench, args, backend, INSTANT_MODEL, max(2, most))
        urls[OURS_V1] = (server.url, None)
        pids["server"], pids["worker"] = [server.pid], [w.proc.pid for w in workers]
        report.params["workers"] = len(workers)
        pids["backend"] = [bench.processes[0].proc.pid]
        pids["load generator"] = [os.getpid()]
        cpu = Cpu(pids)
        processes = {BARE: (BARE,), PASS: (PASS,), LITELLM: (LITELLM,), OURS_V1: ("server", "worker")}
        processes[CHAT_API] = ("server", "worker")
        async with http_client(most) as client:
            api = OurApi(client, server.url)
            users = await login_users(api, min(most, MAX_USERS), f"paced-{uuid.uuid4().hex[:6]}")
            warm = ChatSupply(api, users[:1])
            for request in make_paths(client, api, warm, urls, INSTANT_MODEL, 4).values():
                result = await request(0, 0)
                if not result.ok:
                    raise RuntimeError(f"a path does not work before the measurement: {result.error}")
            await cpu.measure_idle(idle_seconds)
            report.metrics["idle_cpu_per_s"] = cpu.idle
            for level in levels:
                supply = ChatSupply(api, users)
                per_task = int((min(level.answer_seconds, 5.0) + window + 2) / level.answer_seconds) + 2
                tasks_per_user = -(-level.streams // len(users))
                # At most 30 a user beforehand (a stream that finds none makes one: a request more).
                await supply.fill(min(30, per_task * tasks_per_user * reps))
                paths = make_paths(client, api, supply, urls, INSTANT_MODEL, tokens)
                runs["instant", level.streams] = await measure_paths(
                    f"{level.streams} streams", paths, processes, level, cpu, reps, window, whole=args.tiny
                )
                loads.append(os.getloadavg()[0])
            _level_tables(report, runs, levels, args.rate)
            for level in levels:
                _judge(report, f"{level.streams} paced streams", runs["instant", level.streams])
            await _profiles(
                report,
                args,
                bench.log_dir,
                {"server": server.pid, "worker": workers[0].proc.pid},
                lambda supply: make_paths(client, api, supply, urls, INSTANT_MODEL, tokens),
                api,
                users,
                levels[0],
                profile_seconds,
                [OURS_V1] if args.tiny else [OURS_V1, CHAT_API],
            )
    if use_model:
        await _real_model(report, args, reps, runs, loads)
    else:
        report.notes.append("the real model's figures: skipped (tiny mode or --skip-model)")
    report.metrics["loadavg_after_each_level"] = loads
    report.notes.append(
        "load average (1 min) after each part: "
        + ", ".join(f"{x:.2f}" for x in loads)
        + f" on {os.cpu_count()} cores; the machine is shared, so every process competes with other work"
    )
    return report


async def _real_model(
    report: Report,
    args: argparse.Namespace,
    reps: int,
    runs: dict[tuple[str, int], dict[str, PathRuns]],
    loads: list[float],
) -> None:
    """The same measurement on the bundled CPU backend (SmolLM2): bare relay, ours /v1, our chat API."""
    level = Level(args.model_streams, 0.0, args.model_tokens)
    with BenchRun("paced-model", keep_logs=args.keep_logs, embedded=args.embedded) as bench:
        backend = bench.start_cpu_backend()
        backend_pid = bench.processes[0].proc.pid
        bare_url, bare_pid = bench.start_bare_relay(backend, upstream="tgi")
        server, workers = _stack(bench, args, backend, MODEL_NAME, max(2, level.streams))
        cpu = Cpu(
            {
                BARE: [bare_pid],
                "server": [server.pid],
                "worker": [w.proc.pid for w in workers],
                "backend": [backend_pid],
                "load generator": [os.getpid()],
            }
        )
        async with http_client(level.streams) as client:
            api = OurApi(client, server.url)
            users = await login_users(api, level.streams, f"paced-model-{uuid.uuid4().hex[:6]}")
            urls: dict[str, tuple[str, str | None]] = {BARE: (bare_url, None), OURS_V1: (server.url, None)}
            warm = make_paths(client, api, ChatSupply(api, users[:1]), urls, MODEL_NAME, 4)
            for request in warm.values():
                await request(0, 0)
            # How fast the model streams alone: the answers' time, for the stagger and the chats to make.
            probe = await stream_openai(client, bare_url, MODEL_NAME, MESSAGES, level.tokens)
            seconds = (probe.ended or probe.started) - probe.started
            level.rate = probe.tokens / seconds if seconds > 0 and probe.tokens else 10.0
            await cpu.measure_idle(3.0)
            supply = ChatSupply(api, users)
            await supply.fill(reps * (int((args.model_window + 10) / max(seconds, 1.0)) + 2))
            paths = make_paths(client, api, supply, urls, MODEL_NAME, level.tokens)
            processes = {BARE: (BARE,), OURS_V1: ("server", "worker"), CHAT_API: ("server", "worker")}
            model_runs = await measure_paths(
                f"real model, {level.streams} streams", paths, processes, level, cpu, reps, args.model_window
            )
            loads.append(os.getloadavg()[0])
    runs["model", level.streams] = model_runs
    report.params["real_model"] = f"{MODEL_NAME} on the bundled CPU backend, {level.streams} streams"
    _path_table(
        report,
        f"The real model ({MODEL_NAME}, bundled CPU backend): {level.streams} streams of up to {level.tokens} "
        f"tokens, at its own pace (about {level.rate:.0f} tokens a second alone)",
        f"model_{level.streams}",
        model_runs,
        None,
    )
    _judge(report, f"the real model, {level.streams} streams", model_runs)


def _stack(
    bench: BenchRun, args: argparse.Namespace, backend: str, model: str, slots: int
) -> tuple[Server, list[ManagedProcess]]:
    """A server (its database pool as ``--db-pool`` says) and workers of ``model`` with ``slots`` slots in
    all (a worker has at most WORKER_SLOTS)."""
    extra = {"OASST_SERVER_DATABASE_POOL_SIZE": str(args.db_pool)} if args.db_pool else {}
    server = bench.start_server(bench.database(), bench.redis_prefix(), **extra)
    count = -(-slots // WORKER_SLOTS)
    workers = [
        bench.start_worker(server.url, backend, model=model, max_parallel=-(-slots // count))
        for _ in range(count)
    ]
    wait_for_model(server.url, model, workers=count)
    return server, workers


def _level_tables(
    report: Report, runs: dict[tuple[str, int], dict[str, PathRuns]], levels: list[Level], rate: float
) -> None:
    for level in levels:
        _path_table(
            report,
            f"{level.streams} concurrent streams of {level.tokens} tokens, paced at {rate:g} tokens a second a "
            "stream (one token an event)",
            f"instant_{level.streams}",
            runs["instant", level.streams],
            rate,
        )


def _path_table(report: Report, title: str, key: str, runs: dict[str, PathRuns], rate: float | None) -> None:
    table = Table(
        title + ": CPU per relayed token (µs), idle subtracted",
        [
            "path",
            "tokens",
            "pace (tok/s a stream)",
            "relay / server µs",
            "worker µs",
            "total µs (spread)",
            "tokens per CPU-s",
            "vs bare relay",
            "worker vs bare",
            "errors",
        ],
    )
    bare = runs[BARE].us_per_token() if BARE in runs else None
    metrics: dict[str, dict[str, object]] = {}
    for name, path in runs.items():
        total = path.us_per_token()
        first = path.us_per_token(path.processes[0])
        worker = path.us_per_token("worker") if "worker" in path.processes else None
        spread = path.spread()
        table.rows.append(
            [
                name,
                num(path.tokens),
                num(path.pace, 1),
                num(first),
                num(worker),
                num(total)
                + (f" ({num(spread[0])}-{num(spread[1])})" if spread and len(path.windows) > 1 else ""),
                num(1e6 / total if total else None),
                fmt_ratio(ratio(total, bare)),
                fmt_ratio(ratio(worker, bare)),
                f"{path.errors} of {path.requests}",
            ]
        )
        metrics[name] = {
            "tokens": path.tokens,
            "requests": path.requests,
            "errors": path.errors,
            "first_error": path.first_error,
            "pace": path.pace,
            "us_per_token": total,
            "us_per_token_by_process": {p: path.us_per_token(p) for p in path.processes},
            "ratio_to_bare": ratio(total, bare),
            "worker_ratio_to_bare": ratio(worker, bare),
            "spread": spread,
            "cpu_s": {p: path.cpu(p) for p in path.processes},
            "backend_us_per_token": path.us_per_token("backend"),
            "load_generator_us_per_token": path.us_per_token("load generator"),
        }
        if path.errors:
            report.notes.append(
                f"{title.split(':')[0]}, {name}: {path.errors} of {path.requests} streams failed; the first: "
                f"{(path.first_error or '')[:300]}"
            )
    report.tables.append(table)
    report.metrics[key] = metrics
    if rate:
        slow = [name for name, path in runs.items() if path.pace is not None and path.pace < 0.9 * rate]
        if slow:
            report.notes.append(
                f"{title.split(':')[0]}: the pace was not held on {', '.join(slow)} (below 90 % of {rate:g} "
                "tokens a second a stream): the machine could not keep up, tokens bunched, and per-token "
                "figures there are lower than at the model's pace"
            )


def _judge(report: Report, label: str, runs: dict[str, PathRuns]) -> None:
    bare = runs[BARE].us_per_token() if BARE in runs else None
    bare_ok = BARE in runs and runs[BARE].errors == 0
    for name, goal in GOALS.items():
        if name not in runs:
            continue
        path = runs[name]
        value = ratio(path.us_per_token(), bare)
        clean = path.errors == 0 and bare_ok
        report.targets.append(
            Target(
                f"CPU per token at the model's pace, {label}, {name}: server + worker vs the bare relay",
                f"<= {goal:g}x, no errors",
                f"{fmt_ratio(value)}x ({num(path.us_per_token())} µs vs {num(bare)} µs; "
                f"{path.errors} errors)",
                None if value is None else value <= goal and clean,
            )
        )
    if OURS_V1 in runs:
        path = runs[OURS_V1]
        value = ratio(path.us_per_token("worker"), bare)
        report.targets.append(
            Target(
                f"CPU per token at the model's pace, {label}, the worker alone (/v1) vs the bare relay",
                f"<= {WORKER_GOAL:g}x",
                f"{fmt_ratio(value)}x ({num(path.us_per_token('worker'))} µs vs {num(bare)} µs)",
                None if value is None else value <= WORKER_GOAL and path.errors == 0,
            )
        )


async def _profiles(
    report: Report,
    args: argparse.Namespace,
    log_dir: Path,
    pids: dict[str, int],
    paths_of: Callable[[ChatSupply], dict[str, Request]],
    api: OurApi,
    users: list[str],
    level: Level,
    seconds: float,
    names: list[str],
) -> None:
    """py-spy on the server and the worker while ``level``'s paced streams run on each of ``names``."""
    spy = py_spy()
    if spy is None:
        report.notes.append("py-spy is not installed: no profiles at the model's pace")
        return
    profiles: dict[str, object] = {}
    stagger = min(level.answer_seconds, 5.0)
    for name in names:
        supply = ChatSupply(api, users)
        if name == CHAT_API:
            tasks_per_user = -(-level.streams // len(users))
            await supply.fill(tasks_per_user * (int((stagger + seconds) / level.answer_seconds) + 2))
        request = paths_of(supply)[name]
        results: list[StreamResult] = []

        async def drive(
            deadline: float, request: Request = request, results: list[StreamResult] = results
        ) -> None:
            results.extend(await until(deadline, request, level.streams, stagger=stagger))

        sampled = await profile_during(spy, pids, seconds + stagger, args.rate_py_spy, log_dir, drive)
        load = summarize(results)
        scenario = f"{name}, {level.streams} streams at {level.rate:g} tokens a second"
        entry: dict[str, object] = {"requests": load.requests, "errors": load.errors}
        entry |= report_profiles(report, sampled, "Profile at the model's pace", scenario)
        profiles[name] = entry
    report.metrics["profiles"] = profiles


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--levels", type=int_list, help="concurrent streams, comma-separated (full: 100,1000)")
    p.add_argument("--rate", type=float, default=25.0, help="tokens a second a stream (the backend's pace)")
    p.add_argument("--tokens", type=int, help="tokens an answer (full: 100)")
    p.add_argument("--window", type=float, help="seconds of each measurement window (full: 10)")
    p.add_argument("--reps", type=int, help="repetitions of every path, alternated (full: 2)")
    p.add_argument("--skip-litellm", action="store_true")
    p.add_argument("--skip-model", action="store_true", help="without the real model's figures")
    p.add_argument("--model-streams", type=int, default=4)
    p.add_argument("--model-tokens", type=int, default=100)
    p.add_argument("--model-window", type=float, default=20.0)
    p.add_argument("--profile-seconds", type=float, help="seconds of py-spy sampling a path")
    p.add_argument("--rate-py-spy", type=int, default=100, help="py-spy samples per second")
    p.add_argument(
        "--db-pool",
        type=int,
        help="the server's OASST_SERVER_DATABASE_POOL_SIZE (default: its own); for a Postgres shared with others",
    )
    p.add_argument("--litellm-venv", type=Path, default=DEFAULT_VENV)
    main_wrapper(run, p.parse_args())


if __name__ == "__main__":
    main()
