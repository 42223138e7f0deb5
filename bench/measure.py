"""What the benchmarks measure besides their clients' clocks: statistics of the samples, the CPU time
and memory of processes (read from /proc), the times the server recorded for its messages (read from its
database), and the machine a run was on."""

from __future__ import annotations

import contextlib
import math
import os
import platform
import subprocess
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench import ROOT

CLK_TCK = os.sysconf("SC_CLK_TCK")


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def median(values: Sequence[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _status_kb(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory (VmHWM) in MiB."""
    return _status_kb(pid, "VmHWM") / 1024


def rss_mb(pid: int) -> float:
    return _status_kb(pid, "VmRSS") / 1024


def tree_pids(pid: int) -> list[int]:
    """The process and all its descendants."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, []))
    return out


def machine_info() -> dict[str, Any]:
    cpu_model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    mem_kb = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    commit = "unknown"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    load = None
    with contextlib.suppress(OSError):
        load = os.getloadavg()
    return {
        "nproc": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "cpu_model": cpu_model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "commit": commit,
        "loadavg": [round(x, 2) for x in load] if load else None,
    }


async def message_times(database_url: str, ids: Iterable[str]) -> dict[str, dict[str, float | None]]:
    """enqueued_at / started_at / finished_at (epoch seconds) of messages, read from the database."""
    wanted = list(ids)
    if not wanted:
        return {}
    columns = "id, enqueued_at, started_at, finished_at, state"
    rows: list[Any]
    if database_url.startswith("sqlite"):
        import sqlite3

        path = database_url.split(":///", 1)[1]
        conn = sqlite3.connect(path, timeout=30)
        try:
            rows = []
            for i in range(0, len(wanted), 500):
                part = wanted[i : i + 500]
                marks = ",".join("?" * len(part))
                rows += conn.execute(f"SELECT {columns} FROM message WHERE id IN ({marks})", part).fetchall()
        finally:
            conn.close()
    else:
        import asyncpg

        conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://", 1))
        try:
            rows = await conn.fetch(f"SELECT {columns} FROM message WHERE id = ANY($1::varchar[])", wanted)
        finally:
            await conn.close()
    out: dict[str, dict[str, float | None]] = {}
    for row in rows:
        out[row[0]] = {
            "enqueued_at": _epoch(row[1]),
            "started_at": _epoch(row[2]),
            "finished_at": _epoch(row[3]),
        }
        out[row[0]]["state"] = row[4]  # type: ignore[assignment]
    return out


def _epoch(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return float(value.timestamp())
