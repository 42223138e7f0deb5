"""Profile the token relay (worker -> server -> broker -> SSE) with py-spy under an instant-backend load.

Runs a closed-loop load of streams through server + worker + instant backend while ``py-spy record``
samples the server and the worker process (non-blocking, idle frames excluded). Long streams make the
per-token work dominate the per-message work (requests, database). Prints, for each process, where the
CPU went: by layer (redis-py, SSE, SQL, logging...), by library of the leaf frame, the top frames by own
time, the project's frames by inclusive time, and each sample charged to the innermost project frame.

    python -m bench.profile_hot_path              # full: 20 streams of 1,000 tokens for 20 s
    python -m bench.profile_hot_path --tiny       # CI: a few seconds
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.clients import OurApi, StreamResult, http_client
from bench.load import login_users, summarize, until
from bench.measure import cpu_seconds
from bench.report import Report, Table, num
from bench.script import main_wrapper, parser
from bench.stack import INSTANT_MODEL, BenchRun

PROMPT = "Profile me."
# Each sample is charged to the layer of the innermost frame that belongs to one of these packages
# (asyncio's own frames are skipped: a socket write is charged to whoever asked for it).
LAYERS = {
    "redis": "redis-py (commands, pool, parser)",
    "sse_starlette": "sse-starlette (event encoding)",
    "uvicorn": "uvicorn (HTTP and websocket protocols)",
    "starlette": "starlette / FastAPI (routing, middleware, dependencies)",
    "fastapi": "starlette / FastAPI (routing, middleware, dependencies)",
    "websockets": "websockets (frames)",
    "sqlalchemy": "SQL (SQLAlchemy, asyncpg, aiosqlite)",
    "sqlmodel": "SQL (SQLAlchemy, asyncpg, aiosqlite)",
    "asyncpg": "SQL (SQLAlchemy, asyncpg, aiosqlite)",
    "aiosqlite": "SQL (SQLAlchemy, asyncpg, aiosqlite)",
    "logging": "logging (stdlib, loguru, uvicorn's TRACE message logger)",
    "loguru": "logging (stdlib, loguru, uvicorn's TRACE message logger)",
    "pydantic": "pydantic",
    "pydantic_core": "pydantic",
    "aiohttp": "aiohttp + text_generation (backend client)",
    "text_generation": "aiohttp + text_generation (backend client)",
    "httpx": "httpx / httpcore",
    "httpcore": "httpx / httpcore",
    "json": "json",
    "jwt": "auth (JWT)",
    "oasst_inference_server": "the project's own code",
    "oasst_worker": "the project's own code",
    "oasst_shared": "the project's own code",
}
EVENT_LOOP = "event loop and asyncio internals"


def layer_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        match = _FRAME.match(frame)
        if not match:
            continue
        file = match.group("file")
        if "message_logger" in file:
            return LAYERS["logging"]
        layer = LAYERS.get(package_of(file))
        if layer is not None and "__main__" not in file:
            return layer
    return EVENT_LOOP


# The entry points hold every sample of their process: they are not the project's work.
ENTRY_POINTS = ("__main__", "oasst_inference_server/serve.py")


def _is_project_frame(frame: str) -> bool:
    return "(oasst_" in frame and not any(entry in frame for entry in ENTRY_POINTS)


NO_PROJECT_FRAME = "(no project frame: event loop, uvicorn, starlette internals)"
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>.*?)(?::(?P<line>\d+))?\)$")


def py_spy() -> str | None:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def package_of(path: str) -> str:
    """What a frame's file belongs to: its top-level package or stdlib module (py-spy shortens paths)."""
    path = path.replace("\\", "/")
    if path.startswith("<frozen "):
        return path[len("<frozen ") :].rstrip(">").split(".")[0]
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    match = re.search(r"(oasst_[a-z_]+)/", path)
    if match:
        return match.group(1)
    match = re.search(r"python3\.\d+/(.+)", path)
    if match:
        path = match.group(1)
    return path.lstrip("/").split("/")[0].removesuffix(".py") or path


def short_frame(frame: str) -> str:
    match = _FRAME.match(frame.strip())
    if not match:
        return frame.strip()
    return f"{match.group('func')} ({match.group('file')})"


@dataclass
class Profile:
    samples: int = 0
    own: Counter[str] = field(default_factory=Counter)
    inclusive: Counter[str] = field(default_factory=Counter)
    packages: Counter[str] = field(default_factory=Counter)
    # Each sample charged to the innermost frame of the project's own code on its stack.
    nearest: Counter[str] = field(default_factory=Counter)
    layers: Counter[str] = field(default_factory=Counter)

    def project_frames(self) -> Counter[str]:
        """Inclusive time of the project's own functions (not the entry point)."""
        return Counter({k: v for k, v in self.inclusive.items() if _is_project_frame(k)})


def analyse(raw: str) -> Profile:
    """Aggregate py-spy's collapsed stacks: samples by package of the leaf, by own and inclusive frame."""
    profile = Profile()
    for line in raw.splitlines():
        stack, _, count_text = line.strip().rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        # Frames look like "func (file:line)"; anything else (a thread name) is dropped.
        frames = [f.strip() for f in stack.split(";") if _FRAME.match(f.strip())]
        if not frames:
            continue
        profile.samples += count
        leaf = _FRAME.match(frames[-1])
        assert leaf is not None
        profile.own[short_frame(frames[-1])] += count
        profile.packages[package_of(leaf.group("file"))] += count
        for name in {short_frame(f) for f in frames}:
            profile.inclusive[name] += count
        profile.layers[layer_of(frames)] += count
        own_code = [f for f in frames if _is_project_frame(f)]
        profile.nearest[short_frame(own_code[-1]) if own_code else NO_PROJECT_FRAME] += count
    return profile


def _share_table(title: str, counter: Counter[str], total: int, top: int) -> Table:
    table = Table(title, ["%", "samples", "frame"])
    for name, count in counter.most_common(top):
        table.rows.append([f"{100 * count / total:.1f}", str(count), name])
    return table


@dataclass
class Sampled:
    """What :func:`profile_during` measured: a profile per process (None where py-spy wrote none), the
    processes' CPU seconds, the wall time of the load and py-spy's errors."""

    profiles: dict[str, Profile | None]
    cpu: dict[str, float]
    wall: float
    errors: list[str]


async def profile_during(
    spy: str,
    pids: dict[str, int],
    duration: float,
    rate: int,
    out_dir: Path,
    load: Callable[[float], Awaitable[object]],
) -> Sampled:
    """Sample ``pids`` with py-spy for ``duration`` seconds while ``load(deadline)`` runs until the deadline
    (a ``time.monotonic()`` value)."""
    stamp = f"{time.monotonic_ns()}"
    outputs = {name: out_dir / f"py-spy-{name}-{stamp}.txt" for name in pids}
    spies = [
        subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(pid),
                "--rate",
                str(rate),
                "--duration",
                str(max(1, round(duration))),
            ]
            + ["--format", "raw", "--nonblocking", "--function", "--output", str(outputs[name])],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for name, pid in pids.items()
    ]
    cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
    wall0 = time.perf_counter()
    await load(time.monotonic() + duration)
    wall = time.perf_counter() - wall0
    cpu = {name: cpu_seconds(pid) - cpu0[name] for name, pid in pids.items()}
    errors = []
    for spy_proc in spies:
        _, stderr = await asyncio.to_thread(spy_proc.communicate, None, duration + 60)
        if spy_proc.returncode != 0:
            errors.append(stderr.decode(errors="replace")[-500:])
    profiles = {
        name: analyse(path.read_text(errors="replace")) if path.exists() else None
        for name, path in outputs.items()
    }
    return Sampled(profiles, cpu, wall, errors)


def top_entries(label: str, profile: Profile, layers: int = 5, frames: int = 6) -> Table:
    """One short table of a profile: its top layers, top frames by own time, and the samples charged to the
    innermost frame of the project's code on their stack."""
    table = Table(label, ["kind", "%", "samples", "frame"])
    total = max(1, profile.samples)
    sections = (
        ("layer", profile.layers, layers),
        ("own time", profile.own, frames),
        ("innermost project frame", profile.nearest, frames),
    )
    for kind, counter, top in sections:
        for name, count in counter.most_common(top):
            table.rows.append([kind, f"{100 * count / total:.1f}", str(count), name])
    return table


def report_profiles(report: Report, sampled: Sampled, heading: str, scenario: str) -> dict[str, object]:
    """Each sampled process's :func:`top_entries` into ``report`` ("``heading``: the server under
    ``scenario``") and its summary for the metrics, by process; a note for a process py-spy sampled
    nothing of."""
    entry: dict[str, object] = {}
    for process, profile in sampled.profiles.items():
        if profile is None or profile.samples == 0:
            errors = " | ".join(sampled.errors)[:300]
            report.notes.append(
                f"{heading}: py-spy sampled nothing of the {process} under {scenario} {errors}".rstrip()
            )
            continue
        busy = 100 * sampled.cpu[process] / sampled.wall if sampled.wall > 0 else None
        title = (
            f"{heading}: the {process} under {scenario} ({profile.samples} busy samples, {num(busy)} % CPU)"
        )
        report.tables.append(top_entries(title, profile))
        entry[process] = {
            "samples": profile.samples,
            "layers": dict(profile.layers.most_common(8)),
            "own": dict(profile.own.most_common(10)),
            "innermost_project_frame": dict(profile.nearest.most_common(10)),
        }
    return entry


async def run(args: argparse.Namespace) -> Report:
    concurrency = args.concurrency or (4 if args.tiny else 20)
    duration = args.duration or (2.0 if args.tiny else 20.0)
    tokens = args.tokens or (20 if args.tiny else 1000)
    report = Report(
        "profile_hot_path",
        "Profile of the token relay (py-spy, instant backend)",
        args.tiny,
        params={"concurrency": concurrency, "seconds": duration, "tokens_per_stream": tokens},
    )
    spy = py_spy()
    if spy is None:
        report.notes.append("py-spy is not installed: `pip install py-spy` (it is in requirements-dev.txt)")
        report.metrics["skipped"] = True
        return report
    with BenchRun("profile", keep_logs=args.keep_logs, embedded=args.embedded) as bench:
        backend = bench.start_instant_backend()
        server, (worker,) = bench.start_stack(backend, max_parallel=max(concurrency, 2))
        targets = {"server": server.pid, "worker": worker.proc.pid}
        async with http_client(concurrency) as client:
            api = OurApi(client, server.url)
            users = await login_users(api, concurrency, "profile")
            # Warm up (imports, connection pools) before sampling.
            await asyncio.gather(*(_one(api, users[k], tokens) for k in range(concurrency)))
            results: list[StreamResult] = []

            async def drive(deadline: float) -> None:
                results.extend(await until(deadline, lambda k, _: _one(api, users[k], tokens), concurrency))

            sampled = await profile_during(spy, targets, duration, args.rate, bench.log_dir, drive)
            cpu, wall = sampled.cpu, sampled.wall
        load = summarize(results)
        report.metrics.update(
            requests=load.requests,
            errors=load.errors,
            tokens=load.tokens,
            tokens_per_s=load.tokens_per_s,
            cpu_seconds=cpu,
            wall=wall,
        )
        report.notes.append(
            f"load while sampling: {load.requests} streams, {num(load.tokens_per_s)} tokens/s, "
            f"{load.errors} errors; CPU use: server {num(100 * cpu['server'] / wall)} %, "
            f"worker {num(100 * cpu['worker'] / wall)} %"
        )
        for name in targets:
            result = sampled.profiles.get(name)
            if result is None:
                report.notes.append(
                    f"py-spy wrote no profile of the {name}: {' | '.join(sampled.errors)[:500]}"
                )
                continue
            total = result.samples
            report.metrics[f"{name}_samples"] = total
            if total == 0:
                report.notes.append(f"py-spy sampled no busy frame of the {name}")
                continue
            tokens_per_cpu = load.tokens / cpu[name] if cpu[name] > 0 else None
            project = result.project_frames()
            report.metrics[f"{name}_tokens_per_cpu_s"] = tokens_per_cpu
            report.metrics[f"{name}_packages"] = dict(result.packages.most_common(12))
            report.metrics[f"{name}_own"] = dict(result.own.most_common(25))
            report.metrics[f"{name}_project_inclusive"] = dict(project.most_common(25))
            report.metrics[f"{name}_nearest_project_frame"] = dict(result.nearest.most_common(25))
            report.metrics[f"{name}_layers"] = dict(result.layers.most_common())
            label = f"{name} ({total} busy samples, {num(tokens_per_cpu)} tokens per CPU-second)"
            report.tables.append(
                _share_table(
                    f"{label}: CPU by layer (the innermost known library on each sample's stack)",
                    result.layers,
                    total,
                    12,
                )
            )
            report.tables.append(
                _share_table(f"{label}: CPU by library (leaf frame)", result.packages, total, 12)
            )
            report.tables.append(_share_table(f"{label}: top frames by own time", result.own, total, 15))
            report.tables.append(
                _share_table(f"{label}: the project's frames by inclusive time", project, total, 20)
            )
            report.tables.append(
                _share_table(
                    f"{label}: samples charged to the innermost project frame on the stack",
                    result.nearest,
                    total,
                    20,
                )
            )
    return report


async def _one(api: OurApi, token: str, tokens: int) -> StreamResult:
    chat_id = await api.create_chat(token)
    parent = await api.prompter(token, chat_id, None, PROMPT)
    return await api.ask(token, chat_id, parent, INSTANT_MODEL, tokens)


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int)
    p.add_argument("--duration", type=float, help="seconds of sampling")
    p.add_argument("--tokens", type=int, help="tokens per stream")
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    main_wrapper(run, p.parse_args())


if __name__ == "__main__":
    main()
