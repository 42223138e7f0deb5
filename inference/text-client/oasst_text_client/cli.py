"""Command-line arguments of ``oasst-chat``."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from oasst_shared.sampling import SamplingParameters

DEFAULT_SERVER_URL = "http://127.0.0.1:8000"
DEFAULT_USERNAME = "cli-user"

# SamplingParameters field -> the flag that sets it, for error messages.
_SAMPLING_FLAGS = {
    "temperature": "--temperature",
    "top_p": "--top-p",
    "top_k": "--top-k",
    "typical_p": "--typical-p",
    "repetition_penalty": "--repetition-penalty",
    "max_new_tokens": "--max-new-tokens",
    "seed": "--seed",
    "stop": "--stop",
    "do_sample": "--greedy",
}
_SCALAR_SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "typical_p",
    "repetition_penalty",
    "max_new_tokens",
    "seed",
)


@dataclass(frozen=True)
class CliOptions:
    server_url: str
    username: str
    api_key: str | None
    model: str | None
    system_prompt: str | None
    sampling_overrides: dict[str, object] = field(default_factory=dict)
    """Only the sampling fields the user set; the rest come from the model's preset."""
    buffer: bool = False
    list_models: bool = False
    history_file: Path | None = None


def default_history_file(env: Mapping[str, str]) -> Path:
    state_home = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".local/state")
    return Path(state_home) / "oasst-chat" / "history"


def build_parser(env: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    env = os.environ if env is None else env
    parser = argparse.ArgumentParser(
        prog="oasst-chat",
        description=(
            "Chat with a model on the inference server. Interactive when standard input is a terminal; "
            "otherwise each line of standard input is one user turn of a single chat, and only the "
            "answers are written to standard output."
        ),
    )
    conn = parser.add_argument_group("server")
    conn.add_argument(
        "--server-url",
        default=env.get("OASST_SERVER_URL") or DEFAULT_SERVER_URL,
        help="base URL of the inference server (env OASST_SERVER_URL; default %(default)s)",
    )
    conn.add_argument(
        "--username",
        default=env.get("OASST_USERNAME") or DEFAULT_USERNAME,
        help="user to log in as through the debug login of a development server (env OASST_USERNAME; "
        "default %(default)s)",
    )
    conn.add_argument(
        "--api-key",
        default=env.get("OASST_API_KEY") or None,
        help="sign in with this API key instead (env OASST_API_KEY; a production server has no debug "
        "login): create one with POST /api_keys when signed in on the web page, or ask the operator "
        "(oasst-server admin create-api-key)",
    )
    conn.add_argument(
        "--model",
        default=env.get("OASST_MODEL") or None,
        help="model config name (env OASST_MODEL; default: the first model the server offers)",
    )
    conn.add_argument("--list-models", action="store_true", help="print the available models and exit")

    gen = parser.add_argument_group(
        "generation", "Unset parameters take the model's default preset from the server."
    )
    gen.add_argument("--system-prompt", default=None, help="system prompt for every answer of the chat")
    gen.add_argument("--temperature", type=float, default=None, help="sampling temperature (0 = greedy)")
    gen.add_argument("--top-p", type=float, default=None, help="nucleus sampling probability mass (0, 1]")
    gen.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    gen.add_argument("--typical-p", type=float, default=None, help="typical sampling mass (0, 1]")
    gen.add_argument("--repetition-penalty", type=float, default=None, help="penalty for repeated tokens")
    gen.add_argument("--max-new-tokens", type=int, default=None, help="upper bound on the answer's length")
    gen.add_argument("--seed", type=int, default=None, help="random seed, for repeatable sampling")
    gen.add_argument(
        "--stop",
        action="append",
        default=None,
        metavar="TEXT",
        help="stop sequence (repeatable); the answer ends before it",
    )
    gen.add_argument("--greedy", action="store_true", help="deterministic decoding (no sampling)")

    out = parser.add_argument_group("output")
    out.add_argument(
        "--buffer",
        action="store_true",
        help=(
            "pipe mode: write each answer once it is finished instead of token by token, so standard "
            "output holds exactly the final answers even if the server restarts one on another worker"
        ),
    )
    out.add_argument(
        "--history-file",
        type=Path,
        default=None,
        help=f"REPL input history (default {default_history_file(env)})",
    )
    return parser


def parse_args(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> CliOptions:
    """Parse and validate; on bad input argparse prints usage and exits with status 2."""
    env = os.environ if env is None else env
    parser = build_parser(env)
    args = parser.parse_args(argv)

    server_url = args.server_url.strip().rstrip("/")
    if not server_url.startswith(("http://", "https://")):
        parser.error(f"--server-url must start with http:// or https:// (got {args.server_url!r})")

    overrides: dict[str, object] = {
        name: getattr(args, name) for name in _SCALAR_SAMPLING_FIELDS if getattr(args, name) is not None
    }
    if args.stop:
        overrides["stop"] = list(args.stop)
    if args.greedy:
        if args.temperature is not None and args.temperature > 0:
            parser.error("--greedy and a positive --temperature contradict each other")
        overrides["do_sample"] = False
    error = sampling_error(overrides)
    if error:
        parser.error(error)

    api_key = (args.api_key or "").strip() or None
    return CliOptions(
        server_url=server_url,
        username=args.username,
        api_key=api_key,
        model=args.model,
        system_prompt=args.system_prompt or None,
        sampling_overrides=overrides,
        buffer=args.buffer,
        list_models=args.list_models,
        history_file=args.history_file or default_history_file(env),
    )


def sampling_error(overrides: dict[str, object]) -> str | None:
    """A message naming the offending flag when the sampling flags are out of range, else None."""
    try:
        SamplingParameters.model_validate(overrides)
    except ValidationError as exc:
        messages = []
        for err in exc.errors():
            field_name = str(err["loc"][0]) if err["loc"] else ""
            flag = _SAMPLING_FLAGS.get(field_name, field_name)
            messages.append(f"{flag}: {err['msg']}" if flag else err["msg"])
        return "invalid sampling parameter " + "; ".join(messages)
    return None
