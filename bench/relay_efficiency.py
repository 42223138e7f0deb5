"""Benchmark 1: relay efficiency on the real model (SmolLM2 on the bundled CPU backend).

The same prompts with the same greedy settings go (a) straight to the CPU backend with the
text-generation client and (b) through server + worker + backend, read as server-sent events. The two
paths alternate prompt by prompt, so drift on a shared machine hits both alike. Reported: time to first
token, decode tokens/s (after the first token) and end-to-end tokens/s, and the ratios b/a; as a check
of the relay, how many answers came out identical on both paths.

    python -m bench.relay_efficiency            # full: 8 prompts x 128 new tokens
    python -m bench.relay_efficiency --tiny     # CI: seconds
"""

from __future__ import annotations

import argparse
import time

import httpx

from bench.clients import OurApi, StreamResult, http_client
from bench.measure import diff, median, percentile, ratio
from bench.profile_hot_path import profile_during, py_spy, top_entries
from bench.report import Report, Table, Target, fmt_ratio, ms, num, signed_ms
from bench.script import main_wrapper, parser
from bench.stack import BenchRun
from tests.support.stacks import MODEL_NAME

DECODE_GOAL = 0.99  # of the direct path's decode tokens/s
ADDED_TTFT_GOAL = 0.010  # seconds, p50

PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain how a bicycle stays upright while moving.",
    "List some tips for keeping a small vegetable garden healthy.",
    "Describe the water cycle to a ten year old.",
    "What are the main differences between cats and dogs as pets?",
    "Write a friendly letter inviting a neighbour to dinner.",
    "Explain what a computer program is in simple words.",
    "Describe a walk through a forest in autumn.",
]


async def direct_stream(backend_url: str, prompt: str, max_new_tokens: int) -> StreamResult:
    """The text-generation client, as the worker itself uses it."""
    from text_generation import AsyncClient

    client = AsyncClient(backend_url, timeout=300)
    result = StreamResult(started=time.perf_counter())
    try:
        async for response in client.generate_stream(prompt, do_sample=False, max_new_tokens=max_new_tokens):
            result.count_token()
            if not response.token.special:
                result.text += response.token.text
            if response.details is not None:
                result.generated_tokens = response.details.generated_tokens
                result.ok = True
    except Exception as exc:  # the client raises its own error types and aiohttp's
        result.error = f"{type(exc).__name__}: {exc}"
    result.ended = time.perf_counter()
    return result


def _stats(results: list[StreamResult]) -> dict[str, float | None]:
    """TTFT, decode and end-to-end rates of one path's answers."""
    good = [r for r in results if r.ok]
    ttft = [r.ttft for r in good if r.ttft is not None]
    decode = [r.decode_rate for r in good if r.decode_rate is not None]
    tokens = sum(r.generated_tokens or r.tokens for r in good)
    seconds = sum((r.ended or r.started) - r.started for r in good)
    return {
        "ttft_p50": percentile(ttft, 50),
        "ttft_p99": percentile(ttft, 99),
        "decode_tokens_per_s": median(decode),
        "e2e_tokens_per_s": tokens / seconds if seconds > 0 else None,
        "tokens": tokens,
    }


def _meets(direct: dict[str, float | None], ours: dict[str, float | None]) -> bool:
    decode = ratio(ours["decode_tokens_per_s"], direct["decode_tokens_per_s"])
    added = diff(ours["ttft_p50"], direct["ttft_p50"])
    return decode is not None and decode >= DECODE_GOAL and added is not None and added <= ADDED_TTFT_GOAL


async def run(args: argparse.Namespace) -> Report:
    count = args.prompts or (2 if args.tiny else len(PROMPTS))
    max_new_tokens = args.max_new_tokens or (16 if args.tiny else 128)
    report = Report(
        "relay_efficiency",
        "1. Relay efficiency on the real model (SmolLM2, CPU backend)",
        args.tiny,
        params={"prompts": count, "max_new_tokens": max_new_tokens, "greedy": True},
    )
    with BenchRun("relay", keep_logs=args.keep_logs, embedded=args.embedded) as bench:
        backend = bench.start_cpu_backend()
        server, workers = bench.start_stack(backend, model=MODEL_NAME, max_parallel=1)
        sampled = None
        info = httpx.get(f"{backend}/info", timeout=10).json()
        from oasst_shared.chat_template import render
        from oasst_shared.protocol import ChatTurn

        def rendered(prompt: str) -> str:
            # What the worker sends for a one-turn chat: the backend's own template and special tokens.
            return render(
                info["chat_template"],
                [ChatTurn(role="user", content=prompt)],
                bos_token=info.get("bos_token") or "",
                eos_token=info.get("eos_token") or "",
            )

        direct: list[StreamResult] = []
        ours: list[StreamResult] = []
        async with http_client(4) as client:
            api = OurApi(client, server.url)
            token = await api.login("relay")

            async def through_server(prompt: str) -> StreamResult:
                chat_id = await api.create_chat(token)
                parent = await api.prompter(token, chat_id, None, prompt)
                return await api.ask(token, chat_id, parent, MODEL_NAME, max_new_tokens)

            # Warm-up: model caches, connection pools, the worker's template.
            await direct_stream(backend, rendered(PROMPTS[-1]), 4)
            await through_server(PROMPTS[-1])
            for i in range(count):
                prompt = PROMPTS[i % len(PROMPTS)]
                if i % 2 == 0:
                    direct.append(await direct_stream(backend, rendered(prompt), max_new_tokens))
                    ours.append(await through_server(prompt))
                else:
                    ours.append(await through_server(prompt))
                    direct.append(await direct_stream(backend, rendered(prompt), max_new_tokens))
                print(f"prompt {i + 1}/{count}: done", flush=True)
            d, o = _stats(direct), _stats(ours)
            spy = py_spy()
            if spy is not None and not _meets(d, o):  # what limits it: our processes while they relay
                pids = {"server": server.pid, "worker": workers[0].proc.pid}
                seconds = 1.0 if args.tiny else 10.0

                async def drive(deadline: float) -> None:
                    i = 0
                    while time.monotonic() < deadline:
                        await through_server(PROMPTS[i % len(PROMPTS)])
                        i += 1

                sampled = await profile_during(spy, pids, seconds, 200, bench.log_dir, drive)
    errors = [r.error for r in direct + ours if not r.ok]
    same = sum(
        1 for a, b in zip(direct, ours, strict=True) if a.ok and b.ok and a.text.strip() == b.text.strip()
    )

    d, o = _stats(direct), _stats(ours)
    decode_ratio = ratio(o["decode_tokens_per_s"], d["decode_tokens_per_s"])
    e2e_ratio = ratio(o["e2e_tokens_per_s"], d["e2e_tokens_per_s"])
    added50 = diff(o["ttft_p50"], d["ttft_p50"])
    table = Table(
        f"{count} prompts, greedy, up to {max_new_tokens} new tokens; one request at a time",
        ["path", "TTFT p50 ms", "TTFT p99 ms", "decode tok/s (median)", "end-to-end tok/s", "tokens"],
    )
    for label, path in (("direct (text-generation client)", d), ("through server + worker (SSE)", o)):
        table.rows.append(
            [
                label,
                ms(path["ttft_p50"]),
                ms(path["ttft_p99"]),
                num(path["decode_tokens_per_s"], 1),
                num(path["e2e_tokens_per_s"], 1),
                num(path["tokens"]),
            ]
        )
    table.rows.append(
        [
            "ours / direct",
            f"{signed_ms(added50)} ms",
            f"{signed_ms(diff(o['ttft_p99'], d['ttft_p99']))} ms",
            fmt_ratio(decode_ratio),
            fmt_ratio(e2e_ratio),
            "",
        ]
    )
    report.tables.append(table)
    report.metrics = {
        "direct": d,
        "ours": o,
        "decode_ratio": decode_ratio,
        "e2e_ratio": e2e_ratio,
        "added_ttft_p50": added50,
        "identical_answers": same,
        "answers": count,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
    }
    for name, profile in (sampled.profiles if sampled else {}).items():
        if profile is not None and profile.samples:
            busy = 100 * sampled.cpu[name] / sampled.wall if sampled and sampled.wall > 0 else None
            report.tables.append(
                top_entries(
                    f"What limits the unmet targets: the {name} while answers stream (py-spy, "
                    f"{profile.samples} busy samples, {num(busy)} % CPU)",
                    profile,
                )
            )
    report.notes.append(f"identical greedy answers on both paths: {same} of {count}")
    report.notes.append(
        "server, worker and backend share the machine's 2 cores here: CPU the relay uses is CPU llama.cpp "
        "does not get, which a GPU deployment would not see."
    )
    report.targets.append(
        Target(
            "relay efficiency on the real model",
            "decode >= 0.99 of direct tokens/s",
            f"{fmt_ratio(decode_ratio)} (decode), {fmt_ratio(e2e_ratio)} (end to end)",
            None if decode_ratio is None else decode_ratio >= DECODE_GOAL,
        )
    )
    report.targets.append(
        Target(
            "added time to first token on the real model",
            "p50 <= 10 ms",
            f"{signed_ms(added50)} ms",
            None if added50 is None else added50 <= ADDED_TTFT_GOAL,
        )
    )
    return report


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, help="number of prompts (each on both paths)")
    p.add_argument("--max-new-tokens", type=int)
    main_wrapper(run, p.parse_args())


if __name__ == "__main__":
    main()
