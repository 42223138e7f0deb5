"""``make up``: the whole stack on the embedded default, in the foreground.

Starts the bundled CPU backend (SmolLM2), the server (SQLite + in-process broker) and one worker,
prefixes their logs, prints where to chat, and on Ctrl-C stops everything it started.
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

    def start(self, name: str, module: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
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
        print(">>> starting the bundled CPU backend (SmolLM2-135M-Instruct)", flush=True)
        backend = stack.start(
            "backend",
            "oasst_cpu_backend",
            {"OASST_CPU_BACKEND_HOST": backend_host, "OASST_CPU_BACKEND_PORT": str(backend_port)},
        )
        print(">>> starting the server (SQLite, in-process broker)", flush=True)
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
        if not _wait_http(f"{backend_url}/health", backend, 120):
            print("!!! the backend did not come up; see its log above", file=sys.stderr)
            return 1
        if not _wait_http(f"{server_url}/health", server, 60):
            print("!!! the server did not come up; see its log above", file=sys.stderr)
            return 1
        print(">>> starting one worker", flush=True)
        worker = stack.start(
            "worker",
            "oasst_worker",
            {
                "OASST_WORKER_SERVER_URL": f"ws://{host}:{port}",
                "OASST_WORKER_BACKEND_URL": backend_url,
            },
        )
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
            f"  Model:           SmolLM2-135M-Instruct\n"
            f"  Text client:     .venv/bin/oasst-chat --server-url {server_url}\n"
            f"  Backend (TGI):   {backend_url}\n"
            f"Press Ctrl-C to stop.\n",
            flush=True,
        )
        while not interrupted.is_set():
            for name, proc in stack.procs.items():
                if proc.poll() is not None:
                    print(f"!!! {name} exited with code {proc.returncode}; stopping", file=sys.stderr)
                    return 1
            interrupted.wait(0.5)
        print("\n>>> stopping", flush=True)
        return 0
    finally:
        stack.stop()


if __name__ == "__main__":
    sys.exit(main())
