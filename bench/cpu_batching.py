"""Benchmark 11: the bundled CPU backend's continuous batching and prefix cache, with the real model.

Both figures are ratios of paths measured in the same run, on the same backend process:

- output tokens/s with 4 concurrent streams against 1 stream (target >= 1.8x on two cores): the same
  kind of prompt and answer length each time, each stream with a prompt of its own;
- the backend's CPU time per output token, 1 stream against 4: what the wall-clock ratio would be on
  cores of its own (the machine may be shared; other processes' load does not count here);
- time to first token of a follow-up turn (the previous turn's prompt and answer are in the prefix
  cache) against the same prompt cold (its prefix evicted first), target below half.

    python -m bench.cpu_batching               # full: 128 tokens per stream, 3 follow-ups
    python -m bench.cpu_batching --tiny        # CI: seconds
    python -m bench.cpu_batching --model-config SmolLM2-135M-Instruct-Q8_0   # another model config
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx

from bench.clients import stream_tgi
from bench.measure import cpu_seconds
from bench.report import Report, Table, Target
from bench.script import main_wrapper, parser
from bench.stack import BenchRun

STREAMS = 4
SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
# About 300 tokens of conversation: the history a follow-up turn carries.
HISTORY = (
    SYSTEM
    + "<|im_start|>user\nHere are my notes for the garden this year. "
    + "Tomatoes along the south fence, beans on the trellis, basil between them, and marigolds at the "
    "corners to keep the pests away. " * 8 + "What should I plant first?<|im_end|>\n<|im_start|>assistant\n"
)


def counting_prompt(start: int) -> str:
    return ", ".join(str(n) for n in range(start, start + 12)) + ","


def unrelated_prompt(index: int) -> str:
    return f"<|im_start|>user\nTell me fact number {index} about the moon.<|im_end|>\n<|im_start|>assistant\n"


async def stream(client: httpx.AsyncClient, url: str, prompt: str, tokens: int) -> tuple[float, int, str]:
    """Seconds to the first token, tokens generated, the text (a stream that failed raises)."""
    result = await stream_tgi(client, url, prompt, tokens)
    if not result.ok or result.ttft is None:
        raise RuntimeError(f"a stream of the CPU backend failed: {result.error}")
    return result.ttft, result.tokens, result.text


async def tokens_per_second(
    client: httpx.AsyncClient, url: str, pid: int, streams: int, tokens: int, offset: int
) -> tuple[float, float]:
    """Output tokens/s of ``streams`` concurrent streams, and the backend's CPU seconds per token."""
    started, cpu = time.perf_counter(), cpu_seconds(pid)
    results = await asyncio.gather(
        *(stream(client, url, counting_prompt(offset + 20 * i), tokens) for i in range(streams))
    )
    count = sum(count for _, count, _ in results)
    return count / (time.perf_counter() - started), (cpu_seconds(pid) - cpu) / count


async def evict(client: httpx.AsyncClient, url: str, salt: int) -> None:
    """Fill every slot with unrelated short requests: the least recently used caches give way."""
    await asyncio.gather(*(stream(client, url, unrelated_prompt(salt * 10 + i), 2) for i in range(STREAMS)))


async def run(args: argparse.Namespace) -> Report:
    tokens = 16 if args.tiny else args.tokens
    turns = 1 if args.tiny else args.turns
    report = Report(
        "cpu_batching",
        "11. CPU backend: continuous batching and the prefix cache (real SmolLM2)",
        args.tiny,
        params={
            "streams": STREAMS,
            "tokens_per_stream": tokens,
            "follow_ups": turns,
            "model": args.model_config or "the default Q4_1 file",
        },
    )
    env = {"OASST_CPU_BACKEND_PARALLEL_SEQUENCES": str(STREAMS)}
    if args.model_config:
        env["OASST_CPU_BACKEND_MODEL_CONFIG_NAME"] = args.model_config
    with BenchRun("cpu-batching", keep_logs=args.keep_logs) as bench:
        url = bench.start_cpu_backend(**env)
        pid = next(p for p in bench.processes if p.name == "cpu-backend").proc.pid
        async with httpx.AsyncClient(timeout=600) as client:
            await stream(client, url, counting_prompt(1), 4)  # warm-up
            one, one_cpu = await tokens_per_second(client, url, pid, 1, tokens, 100)
            four, four_cpu = await tokens_per_second(client, url, pid, STREAMS, tokens, 200)
            one_again, one_again_cpu = await tokens_per_second(client, url, pid, 1, tokens, 300)
            warm_ttfts, cold_ttfts = [], []
            for turn in range(turns):
                history = HISTORY.replace("this year", f"this year ({turn})")
                _, _, answer = await stream(client, url, history, 24)
                follow_up = (
                    history
                    + answer
                    + "<|im_end|>\n<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n"
                )
                await evict(client, url, 2 * turn)
                cold_ttfts.append((await stream(client, url, follow_up, 1))[0])
                await evict(client, url, 2 * turn + 1)
                await stream(client, url, history, 24)  # the turn again: its prompt and answer cached
                warm_ttfts.append((await stream(client, url, follow_up, 1))[0])
            health = (await client.get(f"{url}/health")).json()
    single = (one + one_again) / 2
    speedup = four / single
    single_cpu = (one_cpu + one_again_cpu) / 2
    cpu_gain = single_cpu / four_cpu
    cold, warm = statistics.median(cold_ttfts), statistics.median(warm_ttfts)
    report.metrics.update(
        {
            "tokens_per_s_1": single,
            "tokens_per_s_4": four,
            "speedup": speedup,
            "ttft_cold": cold,
            "ttft_warm": warm,
            "cpu_ms_per_token_1": single_cpu * 1000,
            "cpu_ms_per_token_4": four_cpu * 1000,
            "cpu_gain": cpu_gain,
        }
    )
    report.tables.append(
        Table(
            "Output tokens/s of the CPU backend (one process, the streams' total)",
            [
                "streams",
                "tokens/s",
                "against 1 stream",
                "backend CPU ms/token",
                "tokens per CPU second against 1",
            ],
            [
                ["1", f"{single:.1f}", "1.00x", f"{single_cpu * 1000:.1f}", "1.00x"],
                [
                    str(STREAMS),
                    f"{four:.1f}",
                    f"{speedup:.2f}x",
                    f"{four_cpu * 1000:.1f}",
                    f"{cpu_gain:.2f}x",
                ],
            ],
        )
    )
    report.tables.append(
        Table(
            "Time to first token of a follow-up turn (median), seconds",
            ["prefix", "TTFT", "against cold"],
            [["cold (evicted)", f"{cold:.3f}", "1.00"], ["cached", f"{warm:.3f}", f"{warm / cold:.2f}"]],
        )
    )
    report.targets.append(
        Target(
            "CPU backend batching",
            f"{STREAMS} streams >= 1.8x the tokens/s of 1",
            f"{speedup:.2f}x",
            speedup >= 1.8,
        )
    )
    report.targets.append(
        Target(
            "CPU backend prefix cache",
            "follow-up TTFT < half of cold",
            f"{warm / cold:.2f} of cold",
            warm < cold / 2,
        )
    )
    report.notes.append(
        f"1 stream measured before and after the {STREAMS} streams ({one:.1f} and {one_again:.1f} tokens/s) and "
        f"averaged, so that a change of load on the machine during the run shows. Slots: {health.get('slots')}."
    )
    return report


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=128, help="tokens per stream")
    p.add_argument("--turns", type=int, default=3, help="follow-up turns measured")
    p.add_argument("--model-config", help="a cpu model config of the registry (default: the Q4_1 file)")
    main_wrapper(run, p.parse_args())


if __name__ == "__main__":
    main()
