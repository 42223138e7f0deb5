"""The parts of the benchmarks that need no processes: statistics, the report file, the profile parser."""

from __future__ import annotations

import pytest

from bench import clients, load, measure, profile_hot_path, run_all


def test_percentiles_are_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert measure.percentile(values, 50) == 50
    assert measure.percentile(values, 99) == 99
    assert measure.percentile([3.0], 99) == 3.0
    assert measure.percentile([], 50) is None
    assert measure.median([1.0, 2.0, 3.0, 10.0]) == 2.5


def test_closed_loop_runs_every_index_once_on_its_task():
    import asyncio

    seen: list[tuple[int, int]] = []

    async def request(task: int, index: int) -> clients.StreamResult:
        seen.append((task, index))
        await asyncio.sleep(0)
        return clients.StreamResult(started=0.0, ended=1.0, ok=True, tokens=1)

    results = asyncio.run(load.closed_loop(3, 10, request))
    assert len(results) == 10
    assert sorted(i for _, i in seen) == list(range(10))
    assert all(i % 3 == task for task, i in seen)


def _report(script: str, **extra):
    return {
        "script": script,
        "title": f"Title of {script}",
        "tiny": False,
        "params": {"levels": [1, 10], "tokens": 200},
        "tables": [{"title": "A table", "columns": ["a", "b|c"], "rows": [["1", "2"]]}],
        "targets": [{"name": "a target", "target": "<= 5 ms", "measured": "3 ms", "met": True}],
        "notes": ["a note"],
        "metrics": {},
        "seconds": 1.5,
        **extra,
    }


def test_the_report_keeps_the_hand_written_analysis(tmp_path):
    out = tmp_path / "performance.md"
    reports = [
        _report("broker_overhead"),
        {
            "script": "dispatch_latency",
            "failed": True,
            "returncode": 1,
            "tail": ["Traceback", "boom"],
            "seconds": 2,
        },
    ]
    from datetime import datetime, timezone

    started = datetime.now(timezone.utc)
    generated = run_all.render(reports, command="make bench", tiny=False, started=started)
    run_all.write(out, generated)
    details = run_all.details_path(out)
    assert details == tmp_path / "performance-results.md"
    details.write_text(run_all.render_details(reports, command="make bench", tiny=False, started=started))
    text = out.read_text()
    assert text.startswith("# Performance")
    assert "| a target | <= 5 ms | 3 ms | met |" in text
    assert "cores" in text and "make bench" in text
    assert "dispatch_latency | **did not complete**" in text and "(performance-results.md)" in text
    # Every table, and the output of a script that failed, go to the results file beside it.
    tables = details.read_text()
    assert tables.startswith("# Performance")
    assert "| a | b\\|c |" in tables
    assert "dispatch_latency: did not complete" in tables and "boom" in tables
    assert "cores" in tables and "make bench" in tables
    assert "| a target |" not in tables and run_all.BEGIN not in tables
    # A hand-written analysis after the generated part survives the next run.
    out.write_text(text.replace("(Written by hand", "Our analysis: the broker is cheap.\n(Written by hand"))
    run_all.write(
        out,
        run_all.render(
            [_report("relay_efficiency")], command="x", tiny=True, started=datetime.now(timezone.utc)
        ),
    )
    text = out.read_text()
    assert "Our analysis: the broker is cheap." in text
    # Writing the same part again changes nothing (no blank line gathers at the end marker).
    inside = text.split(run_all.BEGIN, 1)[1].split(run_all.END, 1)[0]
    run_all.write(out, run_all.BEGIN + inside + run_all.END + "\n")
    assert out.read_text() == text
    assert "Title of relay_efficiency" in text and "Title of broker_overhead" not in text
    assert text.count(run_all.BEGIN) == 1 and text.count(run_all.END) == 1


def test_the_peer_summary_compares_with_litellm():
    metrics = {
        "10_direct": {"tokens_per_s": 10_000.0, "added_ttft_p50": None},
        "10_LiteLLM": {"tokens_per_s": 1000.0, "added_ttft_p50": 0.012},
        "10_ours": {"tokens_per_s": 2000.0, "added_ttft_p50": 0.004},
    }
    summary = run_all._peer_summary([_report("litellm_compare", metrics=metrics)])
    assert "2.00x LiteLLM's" in summary and "4.0 ms against its 12.0 ms" in summary


@pytest.mark.parametrize(
    ("path", "package"),
    [
        ("sqlalchemy/orm/session.py", "sqlalchemy"),
        ("<frozen runpy>", "runpy"),
        ("asyncio/runners.py", "asyncio"),
        ("oasst_inference_server/workers/worker_connection.py", "oasst_inference_server"),
        ("/x/.venv/lib/python3.11/site-packages/redis/asyncio/client.py", "redis"),
        ("/usr/lib/python3.11/json/encoder.py", "json"),
    ],
)
def test_profile_frames_are_grouped_by_package(path, package):
    assert profile_hot_path.package_of(path) == package


def test_profile_analysis_counts_own_and_inclusive_time():
    raw = "\n".join(
        [
            "main (oasst_inference_server/__main__.py:1);_receive (oasst_inference_server/workers/worker_connection.py:140);xadd (redis/commands/core.py:10) 6",
            "main (oasst_inference_server/__main__.py:1);_receive (oasst_inference_server/workers/worker_connection.py:140) 2",
            "main (oasst_inference_server/__main__.py:1);dumps (json/__init__.py:200) 2",
            "garbage line",
        ]
    )
    result = profile_hot_path.analyse(raw)
    assert result.samples == 10
    assert result.packages["redis"] == 6 and result.packages["json"] == 2
    assert result.own["xadd (redis/commands/core.py)"] == 6
    assert result.inclusive["_receive (oasst_inference_server/workers/worker_connection.py)"] == 8
    assert result.inclusive["main (oasst_inference_server/__main__.py)"] == 10


def test_a_partial_run_keeps_the_stored_reports_of_the_others(tmp_path):
    results = tmp_path / "last-run.json"
    import json

    results.write_text(json.dumps([_report("relay_efficiency"), _report("broker_overhead", seconds=9)]))
    merged = run_all.merge(results, [_report("broker_overhead", seconds=1), _report("dispatch_latency")])
    assert [r["script"] for r in merged] == ["relay_efficiency", "broker_overhead", "dispatch_latency"]
    assert merged[1]["seconds"] == 1


def test_profile_samples_are_charged_to_the_innermost_known_layer():
    raw = "\n".join(
        [
            "run (uvicorn/main.py:1);publish (oasst_inference_server/broker/redis.py:5);"
            "execute_command (redis/asyncio/client.py:9);writelines (asyncio/streams.py:3) 4",
            "run (uvicorn/main.py:1);inner_send (uvicorn/middleware/message_logger.py:60);"
            "log (logging/__init__.py:1) 2",
            "Runner.run (asyncio/runners.py:86) 3",
        ]
    )
    layers = profile_hot_path.analyse(raw).layers
    assert layers[profile_hot_path.LAYERS["redis"]] == 4
    assert layers[profile_hot_path.LAYERS["logging"]] == 2
    assert layers[profile_hot_path.EVENT_LOOP] == 3


def test_the_checked_in_report_has_one_generated_part_between_hand_written_ones():
    from bench import ROOT

    text = (ROOT / "docs" / "performance.md").read_text()
    assert text.count(run_all.BEGIN) == 1 and text.count(run_all.END) == 1
    before, rest = text.split(run_all.BEGIN)
    generated, after = rest.split(run_all.END)
    assert "## Running the benchmarks" in before and "## Where each target stands" in after
    assert "| target | goal | measured | status |" in generated
    assert (ROOT / "docs" / run_all.DETAILS_NAME).exists()


def test_many_streams_clients_wait_longer_than_the_opening_phase():
    """A stream opened first is held, reading nothing, until every stream is open: its client's read
    timeout (and its wait for a pooled connection) follows ``--open-timeout`` instead of a fixed 600 s."""
    import asyncio

    from bench import many_streams

    async def timeouts() -> tuple[float | None, float | None]:
        async with clients.http_client(10, many_streams.client_timeout(1200.0)) as client:
            return client.timeout.read, client.timeout.pool

    read, pool = asyncio.run(timeouts())
    assert read is not None and read > 1200.0
    assert pool is not None and pool > 1200.0
