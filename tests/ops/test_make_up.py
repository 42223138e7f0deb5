"""``make up`` (scripts/up.py), run as a user runs it, on free ports and a database of its own: the stack
comes up and answers; a backend killed with SIGKILL (as a crash in llama.cpp takes it down) is started
again, the worker serves from it once it is back, and the stack goes on serving; Ctrl-C stops it all."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from oasst_shared.model_configs import SMOLLM2_135M_Q8
from tests.e2e.chat_api import ChatApi
from tests.support.fault_flows import final_of, queue
from tests.support.processes import ManagedProcess, free_port, spawn

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MODEL = "SmolLM2-135M-Instruct"
PID = re.compile(
    r">>> (?:starting (?:the bundled CPU backend|the server|one worker)|the backend is starting again)"
    r".*, pid (\d+)"
)


@dataclass
class MakeUp:
    process: ManagedProcess
    url: str
    pids: list[int] = field(default_factory=list)

    def log(self) -> str:
        return self.process.log_path.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float, after: int = 0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            log = self.log()
            if text in log[after:]:
                return log
            if not self.process.alive():
                raise AssertionError(f"make up exited:\n{self.process.log_tail()}")
            time.sleep(0.3)
        raise AssertionError(f"no {text!r} in the log of make up:\n{self.process.log_tail()}")

    def started_pids(self) -> list[int]:
        return [int(pid) for pid in PID.findall(self.log())]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (killed, not yet reaped by make up) is not alive either.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    return False


@pytest.fixture
def make_up(tmp_path: Path) -> Iterator[MakeUp]:
    port, backend_port = free_port(), free_port()
    env = {
        "OASST_SERVER_PORT": str(port),
        "OASST_CPU_BACKEND_PORT": str(backend_port),
        "OASST_SERVER_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path}/oasst.db",
        "OASST_SERVER_ENVIRONMENT": "development",
        "OASST_CPU_BACKEND_CACHE_DIR": str(tmp_path / "models"),  # a quantization is made, not found
    }
    process = spawn("make-up", [sys.executable, "scripts/up.py"], env, tmp_path, cwd=ROOT)
    stack = MakeUp(process, f"http://127.0.0.1:{port}")
    try:
        yield stack
    finally:
        process.stop(signal.SIGINT, timeout=60)  # Ctrl-C
        for pid in stack.started_pids():  # nothing it started may outlive it
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def answer(api: ChatApi) -> dict:
    return final_of(api.events(*queue(api, MODEL, "Say hello.", max_new_tokens=8)))


def first_token(api: ChatApi, chat_id: str, message_id: str) -> None:
    """Until the answer's first token has been streamed."""
    last = None
    while True:
        [event] = api.events(chat_id, message_id, last_event_id=last, limit=1)
        assert event.data["event_type"] not in ("message", "error"), event.data
        if event.data["event_type"] == "token":
            return
        last = event.id


def restarted_backend(make_up: MakeUp, killed: int, mark: int) -> int:
    """The pid of the backend make up starts again after ``killed`` died (the log from ``mark`` on)."""
    make_up.wait_for("the backend exited with code -9", timeout=30, after=mark)
    log = make_up.wait_for(">>> the backend is starting again", timeout=60, after=mark)
    restarted = int(PID.findall(log[mark:])[0])
    assert restarted != killed and alive(restarted)
    return restarted


def test_make_up_starts_a_killed_backend_again_and_the_stack_goes_on_serving(make_up: MakeUp):
    log = make_up.wait_for("The stack is up.", timeout=300)
    # The worker takes as many jobs at once as the backend decodes (4 sequences): none of them idles.
    assert re.search(r"worker ws-\S+ connected: model \S+, 4 slots", log), log[-3000:]
    api = ChatApi(make_up.url, f"user-{uuid.uuid4().hex[:8]}")
    assert answer(api)["message"]["state"] == "complete"
    [backend, server, worker] = make_up.started_pids()

    # Killed mid-answer: the worker sees it die, the answer is retried (one death is under the limit)
    # on the backend make up starts again.
    long = queue(api, MODEL, "Count from 1 to 300, one number per line.", max_new_tokens=400)
    first_token(api, *long)
    mark = len(make_up.log())
    os.kill(backend, signal.SIGKILL)
    backend = restarted_backend(make_up, backend, mark)
    events = api.events(*long)
    final = final_of(events)
    assert final["event_type"] == "message" and final["message"]["state"] == "complete", final
    # The text streamed before the kill is kept, and the new backend continues it.
    restarts = [e.data for e in events if e.data["event_type"] in ("retry", "continuation")]
    assert final["message"]["attempts"] == 2 and len(restarts) == 1, (final, restarts)
    assert restarts[0]["event_type"] == "continuation", restarts
    assert "the backend died while it ran this request" in restarts[0]["reason"], restarts

    # Killed while idle: the worker takes no work while its backend is down, then serves from the
    # new one.
    mark = len(make_up.log())
    os.kill(backend, signal.SIGKILL)
    restarted = restarted_backend(make_up, backend, mark)
    final = answer(api)
    assert final["event_type"] == "message" and final["message"]["state"] == "complete", final
    assert final["message"]["attempts"] == 1  # waited for the backend: no attempt spent
    assert make_up.process.alive() and alive(server) and alive(worker)

    # Ctrl-C stops everything it started, the new backend included.
    assert make_up.process.stop(signal.SIGINT, timeout=60) == 0
    assert not [pid for pid in (restarted, server, worker) if alive(pid)]


def test_make_up_serves_a_second_quantization_made_at_first_use(make_up: MakeUp):
    """The worker of make up can serve SmolLM2 as shipped and as Q8_0; /v1/models lists both, and asking
    for the second has the backend quantize (its progress in make up's output) and load it."""
    make_up.wait_for("The stack is up.", timeout=300)
    with httpx.Client(base_url=make_up.url, timeout=180) as http:
        login = http.get("/auth/callback/debug", params={"code": f"q8-{uuid.uuid4().hex[:8]}"})
        http.headers["Authorization"] = f"Bearer {login.json()['access_token']['access_token']}"
        cards = {c["id"]: c for c in http.get("/v1/models").json()["data"]}
        assert cards[MODEL]["loaded"] and not cards[SMOLLM2_135M_Q8.name]["loaded"]
        mark = len(make_up.log())
        body = {
            "model": SMOLLM2_135M_Q8.name,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 8,
        }
        answer = http.post("/v1/chat/completions", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == SMOLLM2_135M_Q8.name
    log = make_up.log()[mark:]
    assert re.search(r"quantizing to q8_0: tensor \d+/\d+", log), log[-3000:]
