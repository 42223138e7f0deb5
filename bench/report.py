"""A script's results: its tables, its targets met or not, its notes and raw metrics (:class:`Report`),
printed as text and written as JSON, which ``run_all.py`` turns into docs/performance.md; and the
formatting of the tables' cells."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.measure import machine_info

if TYPE_CHECKING:
    from bench.load import LoadSummary


def ms(seconds: float | None, digits: int = 1) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.{digits}f}"


def signed_ms(seconds: float | None, digits: int = 1) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:+.{digits}f}"


def num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}"


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)

    def render(self) -> str:
        widths = [max(len(str(c)), *(len(str(r[i])) for r in self.rows)) for i, c in enumerate(self.columns)]
        lines = [self.title, "  ".join(str(c).rjust(w) for c, w in zip(self.columns, widths, strict=True))]
        lines += ["  ".join(str(v).rjust(w) for v, w in zip(row, widths, strict=True)) for row in self.rows]
        return "\n".join(lines)


@dataclass
class Target:
    name: str
    target: str
    measured: str
    met: bool | None  # None: not measured in this run


@dataclass
class Report:
    script: str
    title: str
    tiny: bool
    params: dict[str, Any] = field(default_factory=dict)
    tables: list[Table] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=machine_info)
    started_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    seconds: float = 0.0

    def note_failures(self, label: str, summary: LoadSummary) -> None:
        if summary.errors:
            self.notes.append(
                f"{label}: {summary.errors} of {summary.requests} failed; "
                f"the first: {(summary.first_error or '')[:300]}"
            )

    def emit(self, json_path: Path | None) -> None:
        print()
        print(f"== {self.title}{' (tiny mode)' if self.tiny else ''}")
        for table in self.tables:
            print()
            print(table.render())
        if self.targets:
            print()
            for t in self.targets:
                state = {True: "MET", False: "NOT MET", None: "n/a"}[t.met]
                print(f"target {t.name}: {t.target} -> {t.measured} [{state}]")
        for note in self.notes:
            print(f"note: {note}")
        if json_path is not None:
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(json.dumps(asdict(self), indent=2, default=str))
