"""Real processes for tests and benchmarks: free ports, starting a Python module with its output in a log
file, waiting until it answers, stopping it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ManagedProcess:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        self.stop(signal.SIGKILL, timeout=5)


def spawn(
    name: str, argv: list[str], env: dict[str, str], log_dir: Path, cwd: Path | None = None
) -> ManagedProcess:
    """Start ``argv`` in ``cwd`` (default ``log_dir``) with ``env`` added to this process's environment,
    its output in a log file in ``log_dir``."""
    log_path = log_dir / f"{name}-{uuid.uuid4().hex[:6]}.log"
    with log_path.open("wb") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            argv,
            env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd or log_dir,
        )
    return ManagedProcess(name, proc, log_path)


def start_process(name: str, module: str, env: dict[str, str], log_dir: Path) -> ManagedProcess:
    """``python -m module`` (see :func:`spawn`)."""
    return spawn(name, [sys.executable, "-m", module], env, log_dir)


def wait_http_ok(url: str, process: ManagedProcess, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.alive():
            raise RuntimeError(f"{process.name} exited early:\n{process.log_tail()}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{process.name} did not become healthy at {url}:\n{process.log_tail()}")


def wait_started(url: str, process: ManagedProcess, timeout: float = 90) -> None:
    """:func:`wait_http_ok`, stopping the process when it never answers."""
    try:
        wait_http_ok(url, process, timeout)
    except BaseException:
        process.stop()
        raise


def wait_for_model(server_url: str, model: str, timeout: float = 60, workers: int = 1) -> None:
    """Return once ``workers`` workers (at least) of ``model`` are connected to the server."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            configs = httpx.get(f"{server_url}/configs/model_configs", timeout=2).json()
            if any(m["name"] == model and m.get("worker_count", 1) >= workers for m in configs):
                return
        except (httpx.HTTPError, ValueError, TypeError, KeyError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"fewer than {workers} workers for {model} registered at {server_url}")
