"""full-dev-setup.sh: the tmux session comes up, the text-client pane chats, and stop leaves nothing.

The script runs on its own tmux server (``tmux -L SESSION``), here with ``TMUX_TMPDIR`` in the test's
temporary directory and free ports, so it touches nothing a developer runs.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.processes import free_port
from tests.support.services import POSTGRES_ADMIN_DSN, REDIS_URL, admin_sql, delete_redis_prefix

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "full-dev-setup.sh"
QUESTION = "What is the capital of France?"


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def require_tmux() -> None:
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed; the dev setup needs it: apt-get install tmux (docs/deploy.md)")


@dataclass
class DevSession:
    name: str
    env: dict[str, str]
    ports: tuple[int, int]

    @property
    def marker(self) -> str:
        return f"OASST_DEV_MARKER={ROOT}#{self.name}"

    def script(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SCRIPT), *args],
            env=self.env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def tmux(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tmux", "-L", self.name, *args], env=self.env, capture_output=True, text=True, timeout=30
        )

    def panes(self) -> dict[str, tuple[str, bool, int]]:
        """role -> (pane id, dead, pid)"""
        out = self.tmux(
            "list-panes", "-s", "-t", self.name, "-F", "#{@role} #{pane_id} #{pane_dead} #{pane_pid}"
        )
        panes = {}
        for line in out.stdout.splitlines():
            role, pane_id, dead, pid = line.split()
            panes[role] = (pane_id, dead == "1", int(pid))
        return panes

    def screen(self, role: str) -> str:
        pane_id = self.panes()[role][0]
        # -J joins the lines tmux wrapped at the pane's width.
        return self.tmux("capture-pane", "-p", "-J", "-S", "-500", "-t", pane_id).stdout

    def all_screens(self) -> str:
        try:
            return "\n".join(f"----- {role}\n{self.screen(role)[-2500:]}" for role in self.panes())
        except Exception as exc:  # the session may be gone
            return f"(no panes: {exc})"

    def wait_for(self, role: str, pattern: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen(role)
            if re.search(pattern, screen, re.S):
                return screen
            time.sleep(0.5)
        raise AssertionError(f"{role} never showed {pattern!r}:\n{self.all_screens()}")

    def marked_processes(self) -> list[int]:
        found = []
        for environ in Path("/proc").glob("[0-9]*/environ"):
            try:
                if self.marker.encode() in environ.read_bytes().split(b"\0"):
                    found.append(int(environ.parent.name))
            except OSError:
                continue
        return found


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is gone for our purposes (its parent, tmux, is gone too once the session is).
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.fixture
def dev_session(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DevSession]:
    require_tmux()
    mode = request.param
    name = f"oasst-test-{uuid.uuid4().hex[:8]}"
    database = f"oasst_devtest_{uuid.uuid4().hex[:10]}"
    prefix = f"test:devsetup:{uuid.uuid4().hex[:8]}:"
    ports = (free_port(), free_port())
    env = {k: v for k, v in os.environ.items() if not k.startswith("OASST_") and k != "TMUX"}
    env.update(
        TMUX_TMPDIR=str(tmp_path),
        OASST_DEV_SESSION=name,
        OASST_DEV_MODE=mode,
        OASST_DEV_POSTGRES_URL=POSTGRES_ADMIN_DSN,
        OASST_DEV_DATABASE=database,
        OASST_DEV_REDIS_URL=REDIS_URL,
        OASST_DEV_REDIS_PREFIX=prefix,
        OASST_DEV_SQLITE_PATH=str(tmp_path / "dev.db"),
        OASST_SERVER_PORT=str(ports[0]),
        OASST_CPU_BACKEND_PORT=str(ports[1]),
        OASST_DEV_CHAT_ARGS=f"--greedy --max-new-tokens 24 --history-file {tmp_path / 'history'}",
        OASST_DEV_ATTACH="0",
        OASST_DEV_TIMEOUT="300",
    )
    session = DevSession(name, env, ports)
    try:
        yield session
    finally:
        if session.tmux("has-session", "-t", name).returncode == 0:
            session.script("stop", timeout=120)
        if mode == "local":
            admin_sql(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            delete_redis_prefix(prefix)


@pytest.mark.slow
@pytest.mark.parametrize("dev_session", ["local", "embedded"], indirect=True)
def test_the_dev_session_comes_up_answers_in_the_chat_pane_and_stops_clean(dev_session: DevSession):
    session = dev_session
    started = session.script()
    assert started.returncode == 0, f"{started.stdout}\n{started.stderr}\n{session.all_screens()}"
    assert "The stack is up" in started.stdout

    mode = session.env["OASST_DEV_MODE"]
    expected = {"backend", "server", "worker-1", "worker-2", "chat"} | (
        {"services"} if mode == "local" else set()
    )
    panes = session.panes()
    assert set(panes) == expected, session.all_screens()
    assert not any(dead for _, dead, _ in panes.values()), session.all_screens()
    if mode == "local":
        assert "using SQLite" not in started.stdout
        assert "Postgres" in started.stdout
        session.wait_for("services", r"postgres: ok.*redis: ok", timeout=30)
    else:
        assert "SQLite" in started.stdout

    # Both workers connect to this session's server.
    server_ws = f"ws://127.0.0.1:{session.ports[0]}"
    for worker in ("worker-1", "worker-2"):
        session.wait_for(worker, re.escape(f"connected to {server_ws}"), timeout=60)

    # A message typed into the text-client pane gets an answer, then the prompt returns.
    # (capture-pane drops trailing blanks: an empty prompt reads "you>")
    session.wait_for("chat", r"(?m)^you>", timeout=60)
    chat_pane = panes["chat"][0]
    session.tmux("send-keys", "-t", chat_pane, "-l", QUESTION)
    session.tmux("send-keys", "-t", chat_pane, "Enter")
    screen = session.wait_for("chat", re.escape(f"you> {QUESTION}") + r"\n.*\S.*\nyou>", timeout=240)
    answer = screen.split(f"you> {QUESTION}", 1)[1].rsplit("you>", 1)[0].strip()
    assert answer and "error:" not in answer, screen

    pids = [pid for _, _, pid in session.panes().values()]
    assert session.marked_processes(), "the stack's processes should carry the marker"
    stopped = session.script("stop", timeout=120)
    assert stopped.returncode == 0, f"{stopped.stdout}\n{stopped.stderr}"

    time.sleep(0.5)
    assert session.tmux("has-session", "-t", session.name).returncode != 0, "the tmux session is still there"
    assert [pid for pid in pids if pid_alive(pid)] == [], "pane processes survived the stop"
    assert session.marked_processes() == [], "processes of the stack survived the stop"
    assert not any(port_open(port) for port in session.ports), "a port of the stack is still served"


# ---------------------------------------------------------------- the script's small cases


def test_the_script_is_valid_bash_and_shellcheck_clean():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    # make test installs shellcheck (scripts/ensure-system-packages.sh): missing means a broken setup.
    assert shutil.which("shellcheck"), "shellcheck is not installed (apt-get install shellcheck)"
    result = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_stop_without_a_session_and_unknown_commands(tmp_path):
    require_tmux()
    env = {**os.environ, "TMUX_TMPDIR": str(tmp_path), "OASST_DEV_SESSION": f"absent-{uuid.uuid4().hex[:6]}"}
    env.pop("TMUX", None)
    stop = subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, text=True, timeout=60)
    assert stop.returncode == 0 and "no session" in stop.stdout
    status = subprocess.run([str(SCRIPT), "status"], env=env, capture_output=True, text=True, timeout=60)
    assert status.returncode == 1 and "no session" in status.stdout
    bad = subprocess.run([str(SCRIPT), "restart-all"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "usage" in bad.stderr


def test_without_tmux_the_script_says_how_to_install_it(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname",):
        (bin_dir / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    result = subprocess.run(
        ["/bin/bash", str(SCRIPT)], env={"PATH": str(bin_dir)}, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert "tmux is not installed" in result.stderr and "apt-get install tmux" in result.stderr
