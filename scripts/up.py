"""``make up``: the whole stack on the embedded default, in the foreground.

Starts the bundled CPU backend (SmolLM2), the server (SQLite + in-process broker) and one worker,
prefixes their logs, prints where to chat, and on Ctrl-C stops everything it started.

A backend that exits (a crash: llama.cpp can take its process down) is started again, after a pause
that doubles with each exit in a row (1 s up to 30 s; a backend that ran a minute starts again at once
after 1 s), and the stack goes on: the worker takes no work while its backend's health check fails and
serves again once it passes. The server or the worker exiting stops the stack.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLOURS = {"backend": "\033[36m", "server": "\033[35m", "worker": "\033[33m"}
RESET = "\033[0m"
# Pauses before a backend that exited is started again: doubled per exit in a row, up to the longest;
# a backend that ran STABLE_AFTER seconds starts from the shortest again.
RESTART_MIN_DELAY = 1.0
RESTART_MAX_DELAY = 30.0
STABLE_AFTER = 60.0


def backend_sequences() -> str:
    """The sequences the bundled backend decodes at once (``OASST_CPU_BACKEND_PARALLEL_SEQUENCES``, else its
    default): the worker takes as many jobs at once, so no slot of the backend stays idle while users wait."""
    from oasst_cpu_backend.settings import Settings as BackendSettings

    default = BackendSettings.model_fields["parallel_sequences"].default
    return os.environ.get("OASST_CPU_BACKEND_PARALLEL_SEQUENCES", str(default))


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    return False


def _demo_api_key(server_url: str, username: str = "demo") -> str | None:
    """An OpenAI API key for the demo user, so the SDK works at once (development only)."""
    import json

    try:
        with urllib.request.urlopen(f"{server_url}/auth/callback/debug?code={username}", timeout=5) as r:
            token = json.load(r)["access_token"]["access_token"]
        request = urllib.request.Request(
            f"{server_url}/api_keys",
            data=json.dumps({"name": "make up"}).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=5) as r:
            return str(json.load(r)["key"])
    except (urllib.error.URLError, OSError, KeyError, ValueError):
        return None


def _relay(name: str, proc: subprocess.Popen[bytes]) -> None:
    colour = COLOURS.get(name, "") if sys.stdout.isatty() else ""
    reset = RESET if colour else ""
    assert proc.stdout is not None
    for line in iter(proc.stdout.readline, b""):
        sys.stdout.write(f"{colour}{name:>7} |{reset} {line.decode(errors='replace')}")
        sys.stdout.flush()


class Stack:
    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._specs: dict[str, tuple[str, dict[str, str]]] = {}
        self._started_at: dict[str, float] = {}

    def start(self, name: str, module: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
        self._specs[name] = (module, env)
        self._started_at[name] = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", module],
            cwd=ROOT,
            env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches us only; we stop the children in order
        )
        self.procs[name] = proc
        threading.Thread(target=_relay, args=(name, proc), daemon=True).start()
        return proc

    def restart(self, name: str) -> subprocess.Popen[bytes]:
        module, env = self._specs[name]
        return self.start(name, module, env)

    def uptime(self, name: str) -> float:
        return time.monotonic() - self._started_at[name]

    def stop(self) -> None:
        for name in ("worker", "server", "backend"):
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    print(f"{name} did not stop in 15 s: killing it", flush=True)
                    proc.kill()
                    proc.wait()


def main() -> int:
    host = os.environ.get("OASST_SERVER_HOST", "127.0.0.1")
    port = int(os.environ.get("OASST_SERVER_PORT", "8000"))
    backend_host = os.environ.get("OASST_CPU_BACKEND_HOST", "127.0.0.1")
    backend_port = int(os.environ.get("OASST_CPU_BACKEND_PORT", "8001"))
    for what, h, p in (("server", host, port), ("backend", backend_host, backend_port)):
        if _port_in_use(h, p):
            print(
                f"port {p} ({what}) is already in use: stop what runs there, or set "
                f"{'OASST_SERVER_PORT' if what == 'server' else 'OASST_CPU_BACKEND_PORT'}",
                file=sys.stderr,
            )
            return 1
    (ROOT / ".data").mkdir(exist_ok=True)
    server_url = f"http://{host}:{port}"
    backend_url = f"http://{backend_host}:{backend_port}"
    stack = Stack()
    interrupted = threading.Event()

    def _on_signal(_signum: int, _frame: object) -> None:
        interrupted.set()

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    try:
        backend = stack.start(
            "backend",
            "oasst_cpu_backend",
            {"OASST_CPU_BACKEND_HOST": backend_host, "OASST_CPU_BACKEND_PORT": str(backend_port)},
        )
        print(f">>> starting the bundled CPU backend (SmolLM2-135M-Instruct), pid {backend.pid}", flush=True)
        server = stack.start(
            "server",
            "oasst_inference_server",
            {
                # A local server on SQLite: production mode (the default) would refuse its known secrets.
                "OASST_SERVER_ENVIRONMENT": os.environ.get("OASST_SERVER_ENVIRONMENT", "development"),
                "OASST_SERVER_HOST": host,
                "OASST_SERVER_PORT": str(port),
                "OASST_SERVER_DATABASE_URL": os.environ.get(
                    "OASST_SERVER_DATABASE_URL", "sqlite+aiosqlite:///./.data/oasst-inference.db"
                ),
            },
        )
        print(f">>> starting the server (SQLite, in-process broker), pid {server.pid}", flush=True)
        if not _wait_http(f"{backend_url}/health", backend, 120):
            print("!!! the backend did not come up; see its log above", file=sys.stderr)
            return 1
        if not _wait_http(f"{server_url}/health", server, 60):
            print("!!! the server did not come up; see its log above", file=sys.stderr)
            return 1
        worker = stack.start(
            "worker",
            "oasst_worker",
            {
                "OASST_WORKER_SERVER_URL": f"ws://{host}:{port}",
                "OASST_WORKER_BACKEND_URL": backend_url,
                "OASST_WORKER_MAX_PARALLEL_REQUESTS": os.environ.get(
                    "OASST_WORKER_MAX_PARALLEL_REQUESTS", backend_sequences()
                ),
            },
        )
        print(f">>> starting one worker, pid {worker.pid}", flush=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and worker.poll() is None and not interrupted.is_set():
            try:
                with urllib.request.urlopen(f"{server_url}/configs/model_configs", timeout=2) as r:
                    if b'"name"' in r.read():
                        break
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)
        api_key = _demo_api_key(server_url)
        bold, reset = ("\033[1m", RESET) if sys.stdout.isatty() else ("", "")
        print(
            f"\n{bold}The stack is up.{reset}\n"
            f"  Web chat:        {server_url}/\n"
            f"  REST API docs:   {server_url}/docs\n"
            f"  OpenAI base URL: {server_url}/v1\n"
            f"  OpenAI API key:  {api_key or 'create one with POST /api_keys (docs/openai-api.md)'}"
            f"   (user 'demo')\n"
            f"  Models:          SmolLM2-135M-Instruct (loaded), SmolLM2-135M-Instruct-Q8_0 (made and loaded\n"
            f"                   on first use: the worker switches; docs/models.md)\n"
            f"  Text client:     .venv/bin/oasst-chat --server-url {server_url}\n"
            f"  Backend (TGI):   {backend_url}\n"
            f"Press Ctrl-C to stop.\n",
            flush=True,
        )
        return _supervise(stack, interrupted)
    finally:
        stack.stop()


def _supervise(stack: Stack, interrupted: threading.Event) -> int:
    """Until Ctrl-C: start the backend again whenever it exits; stop if the server or worker exits."""
    delay = RESTART_MIN_DELAY
    restart_at: float | None = None  # when the backend that exited starts again
    while not interrupted.is_set():
        for name, proc in stack.procs.items():
            if proc.poll() is None or name == "backend":
                continue
            print(f"!!! {name} exited with code {proc.returncode}; stopping", file=sys.stderr, flush=True)
            return 1
        backend = stack.procs["backend"]
        if restart_at is None and backend.poll() is not None:
            if stack.uptime("backend") >= STABLE_AFTER:
                delay = RESTART_MIN_DELAY
            print(
                f"!!! the backend exited with code {backend.returncode}; starting it again in {delay:.0f} s "
                "(the worker takes no work until it is back)",
                file=sys.stderr,
                flush=True,
            )
            restart_at = time.monotonic() + delay
            delay = min(delay * 2, RESTART_MAX_DELAY)
        if restart_at is not None and time.monotonic() >= restart_at:
            restart_at = None
            backend = stack.restart("backend")
            print(f">>> the backend is starting again, pid {backend.pid}", flush=True)
        interrupted.wait(0.5)
    print("\n>>> stopping", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
