"""The benchmarks: each module is a script run from the repository root (``python -m bench.NAME``);
``python -m bench.run_all`` (``make bench``) runs them all and writes docs/performance.md."""
