"""Benchmark 5: load like real users, in the style of the original project's locust file.

Each simulated user logs in, creates a chat and holds 3-20 turns (post a prompt, ask for an answer, read
its event stream to the end) with think time between turns. Users start over a ramp-up period; after
``--duration`` seconds nobody starts a new turn and the turns in flight finish. It runs at 50 and 200
users against the bundled CPU backend (SmolLM2) and against the instant backend, each time on the direct
path (the whole conversation rendered and sent straight to the backend) and through the server.

The server keeps its default admission limits (per-user rate limit, queue cap), as in production.
Reported: turns, error rate, time to first token percentiles, queue wait (started_at - enqueued_at in
the database) and whether anything was lost: every answer must end complete, with the streamed text
equal to the stored message.

    python -m bench.user_load                    # full: 50 and 200 users, both backends, 60 s each
    python -m bench.user_load --tiny             # CI: seconds
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx

from bench.clients import OurApi, StreamResult, http_client, stream_tgi
from bench.measure import message_times, percentile
from bench.report import Report, Table, ms, num
from bench.script import int_list, main_wrapper, parser
from bench.stack import INSTANT_MODEL, BenchRun
from tests.support.processes import wait_for_model
from tests.support.stacks import MODEL_NAME

PROMPTS = [
    "Hi! How are you today?",
    "Can you suggest a name for a small cafe?",
    "What should I cook for dinner tonight?",
    "Tell me a fun fact about the ocean.",
    "How do I keep my houseplants alive?",
    "Write a haiku about the morning.",
    "What is a good way to learn a new language?",
    "Give me three ideas for a weekend trip.",
]


@dataclass
class Scenario:
    users: int
    duration: float
    ramp: float
    think: tuple[float, float]
    turns: tuple[int, int]
    tokens: tuple[int, int]
    seed: int = 7


@dataclass
class Turn:
    result: StreamResult
    message_id: str | None = None
    text_matches: bool = True


@dataclass
class UserLog:
    turns: list[Turn] = field(default_factory=list)
    failed_setup: str | None = None


async def run_users(
    scenario: Scenario, user_fn: Callable[[int, random.Random, float], Awaitable[UserLog]]
) -> tuple[list[UserLog], float]:
    deadline = time.monotonic() + scenario.duration
    started = time.perf_counter()

    async def one(i: int) -> UserLog:
        await asyncio.sleep(scenario.ramp * i / max(1, scenario.users))
        return await user_fn(i, random.Random(scenario.seed * 100_003 + i), deadline)

    logs = await asyncio.gather(*(one(i) for i in range(scenario.users)))
    return list(logs), time.perf_counter() - started


def ours_user(
    api: OurApi, model: str, scenario: Scenario, tag: str
) -> Callable[[int, random.Random, float], Awaitable[UserLog]]:
    async def user(i: int, rng: random.Random, deadline: float) -> UserLog:
        log = UserLog()
        try:
            token = await api.login(f"{tag}-{i}")
            chat_id = await api.create_chat(token)
        except Exception as exc:
            log.failed_setup = f"{type(exc).__name__}: {exc}"
            return log
        parent: str | None = None
        for _ in range(rng.randint(*scenario.turns)):
            if time.monotonic() >= deadline:
                break
            try:
                prompt_id = await api.prompter(token, chat_id, parent, rng.choice(PROMPTS))
            except Exception as exc:
                log.turns.append(
                    Turn(StreamResult(started=time.perf_counter(), error=str(exc), ended=time.perf_counter()))
                )
                break
            result = await api.ask(token, chat_id, prompt_id, model, rng.randint(*scenario.tokens))
            final = (result.final or {}).get("message") or {}
            turn = Turn(
                result,
                result.message_id,
                text_matches=result.ok and result.text == (final.get("content") or ""),
            )
            log.turns.append(turn)
            if not result.ok:
                break
            parent = result.message_id
            await asyncio.sleep(rng.uniform(*scenario.think))
        return log

    return user


def direct_user(
    client: httpx.AsyncClient, backend_url: str, template: dict[str, str], scenario: Scenario
) -> Callable[[int, random.Random, float], Awaitable[UserLog]]:
    from oasst_shared.chat_template import render
    from oasst_shared.protocol import ChatTurn

    async def user(i: int, rng: random.Random, deadline: float) -> UserLog:
        log = UserLog()
        thread: list[ChatTurn] = []
        for _ in range(rng.randint(*scenario.turns)):
            if time.monotonic() >= deadline:
                break
            thread.append(ChatTurn(role="user", content=rng.choice(PROMPTS)))
            prompt = render(
                template["chat_template"],
                thread,
                bos_token=template["bos_token"],
                eos_token=template["eos_token"],
            )
            result = await stream_tgi(client, backend_url, prompt, rng.randint(*scenario.tokens))
            log.turns.append(Turn(result))
            if not result.ok:
                break
            thread.append(ChatTurn(role="assistant", content=result.text))
            await asyncio.sleep(rng.uniform(*scenario.think))
        return log

    return user


def backend_template(url: str) -> dict[str, str]:
    info = httpx.get(f"{url}/info", timeout=10).json()
    return {
        "chat_template": info["chat_template"],
        "bos_token": info.get("bos_token") or "",
        "eos_token": info.get("eos_token") or "",
    }


async def run(args: argparse.Namespace) -> Report:
    user_levels = args.users or ([2] if args.tiny else [50, 200])
    backends = args.backends.split(",") if args.backends else ["cpu", "instant"]
    duration = args.duration or (6.0 if args.tiny else 60.0)
    think = (0.05, 0.2) if args.tiny else (1.0, 5.0)
    turns = (3, 3) if args.tiny else (3, 20)
    tokens = {"cpu": (4, 8) if args.tiny else (8, 32), "instant": (10, 20) if args.tiny else (20, 200)}
    ramp = 0.5 if args.tiny else 10.0
    report = Report(
        "user_load",
        "5. Load like real users (locust-style scenario)",
        args.tiny,
        params={
            "users": user_levels,
            "backends": backends,
            "duration_s": duration,
            "think_s": think,
            "turns": turns,
            "new_tokens": tokens,
            "ramp_s": ramp,
        },
    )
    table = Table(
        f"Users hold {turns[0]}-{turns[1]} turns, think {think[0]:g}-{think[1]:g} s, no new turn after {duration:g} s",
        [
            "backend",
            "users",
            "path",
            "turns",
            "errors",
            "error rate",
            "TTFT p50 ms",
            "p90",
            "p99",
            "queue wait p50 ms",
            "p99",
            "tok/s",
            "lost",
        ],
    )
    with BenchRun("users", keep_logs=args.keep_logs, embedded=args.embedded) as bench:
        urls = {}
        if "cpu" in backends:
            urls["cpu"] = bench.start_cpu_backend()
        if "instant" in backends:
            urls["instant"] = bench.start_instant_backend()
        server = bench.start_server(bench.database(), bench.redis_prefix(), admission_limits=True)
        models = {"cpu": MODEL_NAME, "instant": INSTANT_MODEL}
        for name, url in urls.items():
            bench.start_worker(server.url, url, model=models[name], max_parallel=2 if name == "cpu" else 250)
            wait_for_model(server.url, models[name])
        async with http_client(max(user_levels)) as client:
            api = OurApi(client, server.url)
            for name, url in urls.items():
                template = await asyncio.to_thread(backend_template, url)
                for users in user_levels:
                    scenario = Scenario(users, duration, ramp, think, turns, tokens[name])
                    for path in ("direct", "ours"):
                        if path == "direct":
                            fn = direct_user(client, url, template, scenario)
                        else:
                            fn = ours_user(api, models[name], scenario, f"{name}{users}")
                        logs, wall = await run_users(scenario, fn)
                        row, metrics = await _summarize(name, users, path, logs, wall, server.database_url)
                        table.rows.append(row)
                        report.metrics[f"{name}_{users}_{path}"] = metrics
                        if metrics["errors"]:
                            report.notes.append(
                                f"{name} backend, {users} users, {path}: {metrics['errors']} failed turns; "
                                f"the first: {str(metrics['first_error'])[:300]}"
                            )
                        print(f"{name} backend, {users} users, {path}: done", flush=True)
    report.tables.append(table)
    report.notes.append(
        "direct = each turn's whole conversation rendered and sent straight to the backend, with no queue in "
        "front of it (the CPU backend admits 16 requests and refuses the rest with 429); ours = the chat API. "
        "Queue wait = started_at - enqueued_at of each answer in the database; lost = answers that did not end "
        "complete, or whose streamed text differs from the stored message."
    )
    return report


async def _summarize(
    backend: str, users: int, path: str, logs: list[UserLog], wall: float, database_url: str
) -> tuple[list[str], dict[str, object]]:
    turns = [t for log in logs for t in log.turns]
    setup_errors = sum(1 for log in logs if log.failed_setup)
    errors = [t for t in turns if not t.result.ok]
    ttft = [t.result.ttft for t in turns if t.result.ok and t.result.ttft is not None]
    tokens = sum(t.result.tokens for t in turns if t.result.ok)
    queue: list[float] = []
    lost = 0
    if path == "ours":
        ids = [t.message_id for t in turns if t.message_id]
        times = await message_times(database_url, ids)
        for t in turns:
            if not t.message_id:
                continue
            row = times.get(t.message_id) or {}
            if row.get("state") != "complete" or not t.text_matches:
                lost += 1
            enq, started = row.get("enqueued_at"), row.get("started_at")
            if isinstance(enq, float) and isinstance(started, float):
                queue.append(started - enq)
    attempts = len(turns) + setup_errors
    rate = (len(errors) + setup_errors) / attempts if attempts else 0.0
    first_error = next((t.result.error for t in errors), None) or next(
        (log.failed_setup for log in logs if log.failed_setup), None
    )
    row = [
        backend,
        str(users),
        path,
        str(len(turns)),
        str(len(errors) + setup_errors),
        f"{100 * rate:.1f} %",
        ms(percentile(ttft, 50)),
        ms(percentile(ttft, 90)),
        ms(percentile(ttft, 99)),
        ms(percentile(queue, 50)) if path == "ours" else "-",
        ms(percentile(queue, 99)) if path == "ours" else "-",
        num(tokens / wall if wall > 0 else None),
        str(lost) if path == "ours" else "-",
    ]
    metrics: dict[str, object] = {
        "turns": len(turns),
        "errors": len(errors) + setup_errors,
        "error_rate": rate,
        "ttft_p50": percentile(ttft, 50),
        "ttft_p90": percentile(ttft, 90),
        "ttft_p99": percentile(ttft, 99),
        "queue_wait_p50": percentile(queue, 50),
        "queue_wait_p99": percentile(queue, 99),
        "tokens": tokens,
        "tokens_per_s": tokens / wall if wall > 0 else None,
        "lost": lost,
        "first_error": first_error,
        "wall": wall,
    }
    return row, metrics


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int_list, help="comma-separated numbers of users")
    p.add_argument("--backends", help="comma-separated: cpu,instant")
    p.add_argument("--duration", type=float, help="seconds after which no user starts a turn")
    main_wrapper(run, p.parse_args())


if __name__ == "__main__":
    main()
