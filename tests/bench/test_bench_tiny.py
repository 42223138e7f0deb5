"""CI's tiny mode of the benchmarks: each script runs with ``--tiny`` and must report sane numbers.

The numbers are not judged against the targets (a shared CI machine is too noisy for that); these tests
only keep the scripts from rotting: they start the real processes, finish, lose nothing and measure
something plausible on both paths.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]


def run_tiny(name: str, tmp_path: Path, *extra: str, timeout: float = 240) -> dict[str, Any]:
    out = tmp_path / f"{name}.json"
    proc = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", "--tiny", "--json", str(out), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    report = json.loads(out.read_text())
    assert report["script"] == name and report["tiny"] is True
    assert report["tables"] and all(t["rows"] for t in report["tables"])
    assert report["machine"]["nproc"] >= 1
    return report


def plausible_seconds(value: float | None, upper: float = 30.0) -> bool:
    return value is not None and 0 < value < upper


def test_relay_efficiency(tmp_path):
    report = run_tiny("relay_efficiency", tmp_path)
    m = report["metrics"]
    assert m["errors"] == 0, m["first_error"]
    for path in ("direct", "ours"):
        assert m[path]["tokens"] > 0
        assert plausible_seconds(m[path]["ttft_p50"])
        assert m[path]["decode_tokens_per_s"] > 1
    assert 0.05 < m["decode_ratio"] < 5
    assert {t["name"] for t in report["targets"]} == {
        "relay efficiency on the real model",
        "added time to first token on the real model",
    }


def test_broker_overhead(tmp_path):
    report = run_tiny("broker_overhead", tmp_path)
    levels = report["metrics"]
    assert set(levels) == {"1", "10"}
    for level in levels.values():
        assert level["errors"] == 0, level["first_error"]
        assert level["wrong_token_counts"] == 0
        assert level["tokens"] == level["requests"] * report["params"]["tokens_per_stream"]
        assert plausible_seconds(level["direct_ttft_p50"]) and plausible_seconds(level["ours_ttft_p50"])
        assert level["ours_tokens_per_s"] > 0 and level["direct_tokens_per_s"] > 0
        assert level["tokens_per_server_cpu_s"] > 0
        assert 10 < level["server_peak_rss_mib"] < 4096


def test_dispatch_latency(tmp_path):
    report = run_tiny("dispatch_latency", tmp_path)
    levels = report["metrics"]
    # Both paths, each at both levels: handed over at once (the default) and queued.
    assert set(levels) == {"1", "10", "1 queued", "10 queued"}
    for level in levels.values():
        assert level["lost"] == 0
        assert level["samples"] >= 8
        assert plausible_seconds(level["post_to_worker_p50"], 5)
        assert plausible_seconds(level["enqueue_to_worker_p50"], 5)
        assert plausible_seconds(level["redis_hop_p50"], 1)


def test_scale_replicas(tmp_path):
    report = run_tiny("scale_replicas", tmp_path)
    m = report["metrics"]
    for replicas in ("replicas_1", "replicas_2"):
        assert m[replicas]["errors"] == 0, m[replicas]["first_error"]
        assert m[replicas]["tokens"] == report["params"]["requests"] * report["params"]["tokens_per_stream"]
        assert plausible_seconds(m[replicas]["ttft_p50"])
    assert m["scale_ratio"] > 0
    # OASST_SERVER_PROCESSES: 1 and 2 processes in tiny mode.
    for count in (1, 2):
        assert m[f"processes_{count}"]["errors"] == 0, m[f"processes_{count}"]["first_error"]
        assert m[f"processes_{count}"]["tokens"] == m["replicas_1"]["tokens"]
    assert m["processes_1"]["efficiency"] == 1.0 and m["processes_2"]["efficiency"] > 0


def test_user_load_loses_nothing(tmp_path):
    report = run_tiny("user_load", tmp_path)
    runs = report["metrics"]
    assert set(runs) == {"cpu_2_direct", "cpu_2_ours", "instant_2_direct", "instant_2_ours"}
    for name, run in runs.items():
        assert run["errors"] == 0, f"{name}: {run['first_error']}"
        assert run["turns"] >= 2
        assert plausible_seconds(run["ttft_p50"])
    for name in ("cpu_2_ours", "instant_2_ours"):
        assert runs[name]["lost"] == 0
        assert runs[name]["queue_wait_p50"] is not None and runs[name]["queue_wait_p50"] >= 0


def test_litellm_compare_says_it_skipped_litellm(tmp_path):
    report = run_tiny("litellm_compare", tmp_path)
    assert any("LiteLLM skipped" in note for note in report["notes"])
    m = report["metrics"]
    assert not any(key.endswith("_LiteLLM") for key in m)
    for level in (1, 4):
        assert m[f"{level}_direct"]["errors"] == 0 and m[f"{level}_ours"]["errors"] == 0
        assert m[f"{level}_ours"]["tokens_per_s"] > 0
        assert m[f"{level}_ours"]["cpu_s_per_1k_tokens"] > 0


def test_profile_hot_path(tmp_path):
    # py-spy is a dev requirement: without it this must fail, not skip.
    assert (Path(sys.executable).parent / "py-spy").exists() or shutil.which("py-spy"), "py-spy is missing"
    report = run_tiny("profile_hot_path", tmp_path)
    m = report["metrics"]
    assert m["errors"] == 0 and m["tokens"] > 0
    assert m["server_samples"] > 0, report["notes"]
    assert any("oasst_inference_server" in frame for frame in m["server_project_inclusive"])


def test_scheduling(tmp_path):
    report = run_tiny("scheduling", tmp_path)
    m = report["metrics"]
    for run in ("fair", "fifo"):
        assert m[run]["errors"] == 0, m[run]["first_error"]
        assert plausible_seconds(m[run]["light_ttft_p50"], 60)
    # The light users' one answer each goes ahead of the heavy backlog only with fair queuing.
    assert m["fair"]["light_ttft_p50"] < m["fifo"]["light_ttft_p50"]
    assert set(m["dispatch_latency"]) == {"1", "10", "1 queued", "10 queued"}
    assert all(level["lost"] == 0 for level in m["dispatch_latency"].values())


def test_relay_targets(tmp_path):
    report = run_tiny("relay_targets", tmp_path)
    assert any("LiteLLM skipped" in note for note in report["notes"])
    ttft = report["metrics"]["ttft"]
    assert set(ttft) == {
        "direct",
        "bare relay",
        "ours, /v1/chat/completions",
        "ours, chat API (3 requests)",
        "ours, POST /chats/{id}/turns",
    }
    for name, path in ttft.items():
        assert path["errors"] == 0, f"{name}: {path['first_error']}"
        assert plausible_seconds(path["ttft_p50"])
    cpu = report["metrics"]["cpu"]
    assert {key.split("_", 1)[1] for key in cpu} == {
        "bare relay",
        "ours, /v1/chat/completions",
        "ours, chat API (3 requests)",
    }
    for name, run in cpu.items():
        assert run["errors"] == 0, f"{name}: {run['first_error']}"
        assert run["tokens"] == run["requests"] * int(name.split("_", 1)[0])
        if "ours" in name:  # the bare relay's few tiny streams may cost less than a clock tick
            assert run["tokens_per_relay_cpu_s"] > 0
    names = [t["name"] for t in report["targets"]]
    assert len(names) == 5 and sum(n.startswith("added TTFT at one stream") for n in names) == 2
    # Without LiteLLM the TTFT targets are not judged; an unmet one gets a profile table.
    assert all(t["met"] is None for t in report["targets"] if t["name"].startswith("added TTFT"))
    if any(t["met"] is False for t in report["targets"]):
        assert any(t["title"].startswith("What limits") for t in report["tables"])


def test_many_streams(tmp_path):
    report = run_tiny("many_streams", tmp_path)
    m = report["metrics"]
    assert m["errors"] == 0, m["first_error"]
    assert m["complete"] == m["streams"] == m["open_at_once"]
    assert plausible_seconds(m["ttft_p99"])
    assert 10 < m["server_peak_rss_mib"] < 4096
    (target,) = report["targets"]
    assert target["met"] is True


def test_cpu_batching(tmp_path):
    report = run_tiny("cpu_batching", tmp_path)
    m = report["metrics"]
    assert m["tokens_per_s_1"] > 0 and m["tokens_per_s_4"] > 0
    assert m["cpu_ms_per_token_1"] > 0 and m["cpu_ms_per_token_4"] > 0
    assert plausible_seconds(m["ttft_cold"]) and plausible_seconds(m["ttft_warm"])
    assert {t["name"] for t in report["targets"]} == {"CPU backend batching", "CPU backend prefix cache"}


def test_sql_layer(tmp_path):
    report = run_tiny("sql_layer", tmp_path)
    layers = report["metrics"]
    assert set(layers) == {
        "ORM session (as the server)",
        "SQLAlchemy Core, pooled connection",
        "asyncpg under SQLAlchemy's pool",
        "asyncpg, plain",
    }
    for layer in layers.values():
        assert 0 < layer["read_us"] < 1e6 and 0 < layer["end_us"] < 1e6
