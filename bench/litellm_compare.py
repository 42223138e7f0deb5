"""Benchmark 6: the LiteLLM proxy as a peer: the same instant-backend load through it and through us.

LiteLLM (``litellm[proxy]`` 1.108.x, one worker process, a master key) is installed by this script into
a throwaway virtual environment under /tmp, never into the project's; it proxies the instant backend's
OpenAI-compatible endpoint. In one run, at each concurrency, the same closed loop of streamed requests
goes straight to the backend (OpenAI API), through LiteLLM (OpenAI API) and through our server + worker
(chat API + server-sent events), and our figures are reported as ratios to LiteLLM's.

Tiny mode (CI) skips LiteLLM (its install takes minutes) and says so; it still runs the other two paths.

    python -m bench.litellm_compare              # full: 1, 10, 100 streams of 200 tokens
    python -m bench.litellm_compare --tiny       # CI: seconds, without LiteLLM
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from bench.clients import OurApi, StreamResult, http_client, stream_openai
from bench.load import LoadSummary, closed_loop, login_users, prepare_ours, summarize
from bench.measure import cpu_seconds, diff, peak_rss_mb, ratio, tree_pids
from bench.report import Report, Table, fmt_ratio, ms, num
from bench.script import int_list, main_wrapper, parser
from bench.stack import INSTANT_MODEL, BenchRun
from tests.support.processes import free_port

LITELLM_SPEC = "litellm[proxy]>=1.108,<1.109"
DEFAULT_VENV = Path(os.environ.get("OASST_BENCH_LITELLM_VENV", "/tmp/oasst-bench-litellm"))
PROMPT = "Tell me a long story about a lighthouse keeper."


def ensure_litellm(venv: Path) -> tuple[Path, str]:
    """The litellm executable in ``venv`` (created and installed when missing) and its version."""
    exe = venv / "bin" / "litellm"
    pip = venv / "bin" / "pip"
    if not exe.exists():
        print(
            f"installing {LITELLM_SPEC} into {venv} (a throwaway environment; takes a few minutes)",
            flush=True,
        )
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(pip), "install", "-q", "--disable-pip-version-check", LITELLM_SPEC], check=True, timeout=1800
        )
    version = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return exe, version


def start_litellm(bench: BenchRun, exe: Path, backend_url: str, master_key: str) -> tuple[str, int]:
    port = free_port()
    config = {
        "model_list": [
            {
                "model_name": INSTANT_MODEL,
                "litellm_params": {
                    "model": f"openai/{INSTANT_MODEL}",
                    "api_base": f"{backend_url}/v1",
                    "api_key": "none",
                },
            }
        ],
        "litellm_settings": {"telemetry": False, "drop_params": True},
    }
    path = bench.log_dir / "litellm-config.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    process = bench.spawn(
        "litellm",
        [str(exe), "--config", str(path), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"],
        {"LITELLM_MASTER_KEY": master_key, "LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False"},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if not process.alive():
            raise RuntimeError(f"LiteLLM exited early:\n{process.log_tail()}")
        try:
            if httpx.get(f"{url}/health/liveliness", timeout=2).status_code == 200:
                return url, process.proc.pid
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"LiteLLM did not start:\n{process.log_tail()}")


def openai_path(
    client: httpx.AsyncClient,
    url: str,
    key: str | None,
    level: int,
    total: int,
    messages: list[dict[str, str]],
    tokens: int,
) -> Callable[[], Awaitable[list[StreamResult]]]:
    async def timed() -> list[StreamResult]:
        return await closed_loop(
            level, total, lambda k, i: stream_openai(client, url, INSTANT_MODEL, messages, tokens, key)
        )

    return timed


async def run(args: argparse.Namespace) -> Report:
    levels = args.levels or ([1, 4] if args.tiny else [1, 10, 100])
    tokens = args.tokens or (20 if args.tiny else 200)
    min_requests = args.min_requests or (6 if args.tiny else 40)
    use_litellm = not args.tiny and not args.skip_litellm
    report = Report(
        "litellm_compare",
        "6. Peer comparison: LiteLLM proxy vs our server (instant backend)",
        args.tiny,
        params={"levels": levels, "tokens_per_stream": tokens, "min_requests": min_requests},
    )
    if not use_litellm:
        report.notes.append(
            "LiteLLM skipped (tiny mode or --skip-litellm): only the direct path and ours ran; "
            "run without --tiny for the comparison"
        )
    table = Table(
        f"Closed loop of streams of {tokens} tokens; TTFT in ms",
        [
            "streams",
            "path",
            "TTFT p50",
            "TTFT p99",
            "added p50",
            "tok/s",
            "vs LiteLLM",
            "proxy CPU-s per 1k tokens",
            "peak RSS MiB",
            "errors",
        ],
    )
    with BenchRun("litellm", keep_logs=args.keep_logs, embedded=args.embedded) as bench:
        backend = bench.start_instant_backend()
        litellm_url, litellm_pid, master_key = None, None, f"sk-bench-{uuid.uuid4().hex}"
        if use_litellm:
            exe, version = ensure_litellm(args.litellm_venv)
            report.params["litellm_version"] = version
            litellm_url, litellm_pid = start_litellm(bench, exe, backend, master_key)
        server, (worker,) = bench.start_stack(backend, max_parallel=max(2, max(levels)))
        messages = [{"role": "user", "content": PROMPT}]
        async with http_client(max(levels)) as client:
            api = OurApi(client, server.url)
            users = await login_users(api, max(levels), "peer")
            if litellm_url:  # warm up the proxy (its first request imports and builds clients)
                await stream_openai(client, litellm_url, INSTANT_MODEL, messages, 4, master_key)
            for level in levels:
                total = max(level, min_requests)
                paths: list[tuple[str, Callable[[], Awaitable[list[StreamResult]]], list[int]]] = []

                paths.append(
                    ("direct", openai_path(client, backend, None, level, total, messages, tokens), [])
                )
                if litellm_url and litellm_pid:
                    paths.append(
                        (
                            "LiteLLM",
                            openai_path(client, litellm_url, master_key, level, total, messages, tokens),
                            tree_pids(litellm_pid),
                        )
                    )
                ours_timed = await prepare_ours([api], users, level, total, INSTANT_MODEL, tokens, PROMPT)
                paths.append(("ours", ours_timed, [server.pid]))
                results: dict[str, tuple[LoadSummary, float | None, float | None]] = {}
                worker_cpu = 0.0
                for name, timed, pids in paths:
                    cpu0 = sum(cpu_seconds(p) for p in pids)
                    wcpu0 = cpu_seconds(worker.proc.pid)
                    summary = summarize(await timed())
                    cpu = sum(cpu_seconds(p) for p in pids) - cpu0 if pids else None
                    peak = max((peak_rss_mb(p) for p in pids), default=None) if pids else None
                    results[name] = (summary, cpu, peak)
                    if name.startswith("ours"):
                        worker_cpu = cpu_seconds(worker.proc.pid) - wcpu0
                direct = results["direct"][0]
                peer = results.get("LiteLLM", (None, None, None))[0]
                for name, (summary, cpu, peak) in results.items():
                    per_1k = cpu / summary.tokens * 1000 if cpu is not None and summary.tokens else None
                    cpu_cell = num(per_1k, 3)
                    with_worker = None
                    if name.startswith("ours") and cpu is not None and summary.tokens:
                        with_worker = (cpu + worker_cpu) / summary.tokens * 1000
                        cpu_cell += f" ({num(with_worker, 3)} with the worker)"
                    table.rows.append(
                        [
                            str(level),
                            name,
                            ms(summary.ttft_p(50)),
                            ms(summary.ttft_p(99)),
                            ms(diff(summary.ttft_p(50), direct.ttft_p(50))) if name != "direct" else "",
                            num(summary.tokens_per_s),
                            fmt_ratio(ratio(summary.tokens_per_s, peer.tokens_per_s)) if peer else "n/a",
                            cpu_cell,
                            num(peak),
                            str(summary.errors),
                        ]
                    )
                    report.metrics[f"{level}_{name}"] = {
                        "ttft_p50": summary.ttft_p(50),
                        "ttft_p99": summary.ttft_p(99),
                        "added_ttft_p50": diff(summary.ttft_p(50), direct.ttft_p(50)),
                        "tokens_per_s": summary.tokens_per_s,
                        "cpu_s_per_1k_tokens": per_1k,
                        "cpu_s_per_1k_tokens_with_worker": with_worker,
                        "peak_rss_mib": peak,
                        "errors": summary.errors,
                        "first_error": summary.first_error,
                    }
                print(f"{level} streams: done", flush=True)
    report.tables.append(table)
    report.notes.append(
        "LiteLLM relays one hop (client -> proxy -> backend); ours is two processes (server and worker): "
        "the CPU column counts our server's CPU, and in brackets the server's and the worker's. Added TTFT is against "
        "the direct path at the same concurrency; our TTFT runs from POST assistant_message."
    )
    return report


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--levels", type=int_list, help="comma-separated concurrency levels")
    p.add_argument("--tokens", type=int, help="tokens per stream")
    p.add_argument("--min-requests", type=int)
    p.add_argument("--skip-litellm", action="store_true")
    p.add_argument("--litellm-venv", type=Path, default=DEFAULT_VENV)
    main_wrapper(run, p.parse_args())


if __name__ == "__main__":
    main()
