"""``oasst-server admin export``: the dataset export written to a file or standard output."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncEngine

from oasst_inference_server.chats.export.anonymizing import MIN_SEED_LENGTH, Anonymizer
from oasst_inference_server.chats.export.files import write_lines
from oasst_inference_server.chats.export.lines import DEFAULT_BATCH_CHATS, export_lines
from oasst_inference_server.chats.export.selection import ExportSelection
from oasst_inference_server.db.engine import make_session_factory
from oasst_inference_server.domain_errors import InvalidValue

COMMAND = "export"


def _moment(text: str) -> datetime:
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO date or time: {text!r}") from None


def _batch(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 10_000:
        raise argparse.ArgumentTypeError("1 to 10000 chats")
    return value


def _seed(text: str) -> Anonymizer:
    try:
        return Anonymizer(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        COMMAND,
        help="write the chats that allow data use as Open-Assistant message trees (JSON lines)",
        description="One message tree per line (docs/operating.md#exporting-the-conversations-dataset-export). Without --output, to standard output.",
    )
    parser.add_argument("--output", "-o", type=Path, help="the file to write (written whole or not at all)")
    parser.add_argument("--gzip", action="store_true", help="compress (implied by an --output ending in .gz)")
    parser.add_argument("--since", type=_moment, help="chats created at or after (ISO; UTC without a zone)")
    parser.add_argument("--until", type=_moment, help="chats created before (ISO; UTC without a zone)")
    parser.add_argument("--user-id", help="only this user's chats")
    parser.add_argument(
        "--include-deleted", action="store_true", help="also the chats deleted accounts kept (marked deleted)"
    )
    parser.add_argument(
        "--anonymizer-seed",
        type=_seed,
        help=f"replace message, user and tree ids with hashes keyed by this secret ({MIN_SEED_LENGTH}+ characters)",
    )
    parser.add_argument("--batch-size", type=_batch, default=DEFAULT_BATCH_CHATS, help="chats read per query")


def selection_of(args: argparse.Namespace) -> ExportSelection:
    """The selection the arguments ask for (``InvalidValue`` if they contradict each other)."""
    return ExportSelection(
        since=args.since, until=args.until, include_deleted=args.include_deleted, user_id=args.user_id
    )


def usage_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments, checked before the database is touched; None if nothing."""
    try:
        selection_of(args)
    except InvalidValue as exc:
        return f"--since/--until: {exc.detail}"
    return None


async def run(engine: AsyncEngine, args: argparse.Namespace) -> None:
    selection = selection_of(args)
    output: Path | None = args.output
    compress = args.gzip or (output is not None and output.suffix == ".gz")
    lines = export_lines(make_session_factory(engine), selection, args.batch_size, args.anonymizer_seed)
    count = await write_lines(lines, output, compress=compress)
    print(f"exported {count} message trees to {output or 'standard output'}", file=sys.stderr)
