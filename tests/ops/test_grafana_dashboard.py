"""The Grafana dashboard only charts metrics the server and worker really export."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

from oasst_inference_server import metrics as server_metrics
from oasst_worker import metrics as worker_metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "dashboards" / "oasst-inference.json"


def exported_names() -> set[str]:
    names: set[str] = set()
    for module in (server_metrics, worker_metrics):
        for value in vars(module).values():
            if not isinstance(value, MetricWrapperBase):
                continue
            for family in value.describe():
                # Counters are exported with _total, histograms with _bucket/_count/_sum.
                names.update(
                    f"{family.name}{suffix}" for suffix in ("", "_total", "_bucket", "_count", "_sum")
                )
    return names


def test_every_charted_metric_exists():
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert exprs
    known = exported_names()
    for expr in exprs:
        for name in re.findall(r"\boasst_[a-z_]+", expr):
            assert name in known, f"{name} is charted but not exported"


def test_the_dashboard_covers_the_issue_list():
    text = DASHBOARD.read_text()
    for needle in (
        "workers_connected",
        "queue_depth",
        "queue_oldest_wait",
        "in_flight",
        "time_to_first_token",
        "tokens_per_second",
        "errors_total",
        "retries_total",
        "cancels_total",
    ):
        assert needle in text, needle
