"""The benchmarks: each module is a script run from the repository root (``python -m bench.NAME``);
``python -m bench.run_all`` (``make bench``) runs them all and writes docs/performance.md.

What the scripts share, by concern: ``stack`` starts and removes the processes they measure, ``clients``
and ``load`` drive them, ``measure`` reads the numbers (statistics, /proc, the server's database),
``report`` holds the results and ``script`` is the command line around them.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
