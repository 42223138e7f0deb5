"""Writing an export to a file (whole or not at all) or to standard output, gzip-compressed if asked."""

from __future__ import annotations

import gzip
import io
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO


async def write_lines(lines: AsyncIterator[str], path: Path | None, *, compress: bool) -> int:
    """Write ``lines`` to ``path`` (None: standard output) and return how many were written. A file is
    written under a temporary name and renamed when complete, so a failed export leaves no partial file
    under the name asked for."""
    if path is None:
        if not compress:
            return await _copy(lines, sys.stdout)
        out = io.TextIOWrapper(gzip.GzipFile(fileobj=sys.stdout.buffer, mode="wb"), encoding="utf-8")
        try:
            return await _copy(lines, out)
        finally:
            out.close()  # writes the gzip trailer (standard output itself stays open)
    partial = path.with_name(path.name + ".partial")
    try:
        with (
            gzip.open(partial, "wt", encoding="utf-8")
            if compress
            else partial.open("w", encoding="utf-8") as f
        ):
            count = await _copy(lines, f)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return count


async def _copy(lines: AsyncIterator[str], out: IO[str]) -> int:
    count = 0
    async for line in lines:
        out.write(line)
        count += 1
    out.flush()
    return count
