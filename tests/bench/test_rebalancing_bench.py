"""The rebalancing benchmark in CI's tiny mode: a simulation in virtual time (no server process, no
Postgres or Redis), so it runs with the fast tests. Its figures are deterministic (one seeded stream of
arrivals): the rebalanced fleet must beat the static one on the same arrivals, and lose no job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_rebalancing_tiny(tmp_path):
    out = tmp_path / "rebalancing.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.rebalancing", "--tiny", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    report = json.loads(out.read_text())
    assert report["script"] == "rebalancing" and report["tiny"] is True
    assert report["tables"] and all(t["rows"] for t in report["tables"])
    metrics = report["metrics"]
    assert set(metrics) == {"static", "rebalanced", "rebalanced_fixed"}
    static, moved = metrics["static"], metrics["rebalanced"]
    for run in metrics.values():
        assert run["jobs"] > 500 and run["finished"] == run["jobs"]  # nothing lost, nothing left waiting
        assert run["jobs"] == static["jobs"]  # the same arrivals
    assert static["moves"] == 0 and static["rounds"] == 0
    assert report["params"]["max_moves"] == [10, 10]  # 5 % of 50 workers is less than 10
    for name in ("rebalanced", "rebalanced_fixed"):
        run = metrics[name]
        assert 0 < run["moves"] == run["loads"]  # every order made a switch
        assert run["moves"] <= run["rounds"] * 10
    assert moved["wait_mean"] < static["wait_mean"] and moved["wait_p99"] < static["wait_p99"]
    (target,) = report["targets"]
    assert target["met"] is True
