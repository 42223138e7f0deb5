"""Turn pip's output into progress lines: one per package collected, then what was installed.

Reads pip's standard output (run without -q) on standard input. A terminal gets one line rewritten
in place; a log gets a line every ten packages. Warnings and errors pass through unchanged, and the
whole output is kept for the error message when pip fails (pipefail in the Makefile).
"""

from __future__ import annotations

import re
import sys
import time

# This machine's pip configuration names local package indexes that lack most packages.
NOISE = "is ignored: it is neither a file nor a directory"
COLLECTING = re.compile(r"^(?:Collecting|Processing|Obtaining) (\S+)")
DOWNLOADING = re.compile(r"^\s*Downloading \S+ \(([^)]+)\)")


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else "packages"
    tty = sys.stdout.isatty()
    start = time.monotonic()
    count = 0
    downloaded = 0
    width = 0
    for line in sys.stdin:
        line = line.rstrip("\n")
        if NOISE in line:
            continue
        collecting = COLLECTING.match(line)
        if collecting:
            count += 1
            text = f"    {label}: {count} collected, {downloaded} downloaded ({time.monotonic() - start:.0f}s): {collecting.group(1)[:60]}"
            if tty:
                sys.stdout.write("\r" + text.ljust(width))
                width = len(text)
            elif count % 10 == 1:
                sys.stdout.write(text + "\n")
        elif DOWNLOADING.match(line):
            downloaded += 1
        elif line.startswith("Installing collected packages"):
            text = f"    {label}: installing {len(line.split(':', 1)[1].split(','))} packages"
            sys.stdout.write(("\r" + text.ljust(width) + "\n") if tty else text + "\n")
            width = 0
        elif re.match(r"^(WARNING|ERROR|error|  ×|\s+note:)", line):
            sys.stdout.write(("\n" if tty and width else "") + line + "\n")
            width = 0
        sys.stdout.flush()
    if tty and width:
        sys.stdout.write("\n")
    sys.stdout.write(
        f"    {label}: done in {time.monotonic() - start:.0f}s ({count} packages, {downloaded} downloaded)\n"
    )


if __name__ == "__main__":
    main()
