"""What every benchmark script shares around its measurement: its command line and its main.

A script builds its command line on ``parser(description)`` (adding options of its own), measures in an
async function that returns a :class:`bench.report.Report`, and hands both to :func:`main_wrapper`, which
prints the report and, with ``--json PATH``, writes it for ``run_all.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from bench.report import Report


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--tiny", action="store_true", help="CI mode: seconds, small numbers")
    p.add_argument("--json", type=Path, help="also write the report as JSON here")
    p.add_argument(
        "--embedded",
        action="store_true",
        help="run the server on SQLite with the in-process broker (default: Postgres and Redis)",
    )
    p.add_argument("--keep-logs", action="store_true", help="keep the processes' logs")
    return p


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main_wrapper(
    report_fn: Callable[[argparse.Namespace], Coroutine[Any, Any, Report]], args: argparse.Namespace
) -> None:
    """Run a script's async body and emit its report; exit 1 on failure."""
    started = time.perf_counter()
    report = asyncio.run(report_fn(args))
    report.seconds = round(time.perf_counter() - started, 1)
    report.emit(args.json)
