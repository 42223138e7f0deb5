"""``oasst-chat`` against the real stack: server on SQLite, in-process broker, a worker, SmolLM2 on CPU.

The model's words are not fixed (they differ between llama.cpp builds), so these tests check
properties: exit codes, that each answer is non-empty, and that what the client printed is exactly
what the server stored.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pexpect
import pytest

from tests.support.clients import closing

pytestmark = pytest.mark.slow

OASST_CHAT = str(Path(sys.executable).with_name("oasst-chat"))
PROMPT = "you>"


class StackReader:
    """Reads back, as the same user, what the client made the server store."""

    def __init__(self, url: str, username: str) -> None:
        token = httpx.get(f"{url}/auth/callback/debug", params={"code": username}).json()
        self.http = closing(
            httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {token['access_token']['access_token']}"}
            )
        )

    def only_chat(self) -> dict[str, Any]:
        chats = self.http.get("/chats").json()["chats"]
        assert len(chats) == 1, chats
        return self.http.get(f"/chats/{chats[0]['id']}").json()

    def message(self, chat_id: str, message_id: str) -> dict[str, Any]:
        return self.http.get(f"/chats/{chat_id}/messages/{message_id}").json()


def unique_user() -> str:
    return f"cli-test-{uuid.uuid4().hex[:8]}"


def start_repl(url: str, user: str, max_new_tokens: int, env: dict[str, str]) -> pexpect.spawn:
    """The REPL on a pseudo-terminal wide enough that no line wraps."""
    child = pexpect.spawn(
        OASST_CHAT,
        ["--server-url", url, "--username", user, "--max-new-tokens", str(max_new_tokens)],
        env=env,
        encoding="utf-8",
        timeout=60,
    )
    child.setwinsize(50, 200)
    return child


def test_pipe_mode_answers_each_line_in_one_chat(embedded_stack: Any, client_env: dict[str, str]) -> None:
    user = unique_user()
    result = subprocess.run(
        [OASST_CHAT, "--server-url", embedded_stack.url, "--username", user, "--max-new-tokens", "48"],
        input="Say hi\nWhat is 2+2?\n",
        capture_output=True,
        text=True,
        env=client_env,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr

    chat = StackReader(embedded_stack.url, user).only_chat()
    messages = chat["messages"]
    assert [m["role"] for m in messages] == ["prompter", "assistant", "prompter", "assistant"]
    assert [m["content"] for m in messages if m["role"] == "prompter"] == ["Say hi", "What is 2+2?"]
    answers = [m for m in messages if m["role"] == "assistant"]
    assert all(m["state"] == "complete" for m in answers)
    assert all(m["content"].strip() for m in answers), answers
    # One conversation: the second question hangs under the first answer.
    assert messages[2]["parent_id"] == answers[0]["id"]
    # Standard output is the two answers, each ended by one line break, and nothing else.
    expected = "".join(a["content"] if a["content"].endswith("\n") else a["content"] + "\n" for a in answers)
    assert result.stdout == expected


# prompt_toolkit switches bracketed paste off when it hands the terminal back after a line is entered,
# and on again when it draws the next prompt: reliable marks for "answer starts" and "answer ended".
INPUT_DONE = "\x1b[?2004l"
PROMPT_BACK = "\x1b[?2004h"


def send_turn(child: pexpect.spawn, text: str) -> None:
    child.sendline(text)
    child.expect_exact(INPUT_DONE)


def read_answer(child: pexpect.spawn, timeout: float = 240) -> list[str]:
    """The chunks the terminal received until the next prompt was drawn."""
    chunks: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunks.append(child.read_nonblocking(4096, timeout=1))
        except pexpect.TIMEOUT:
            continue
        if PROMPT_BACK in "".join(chunks):
            return chunks
    raise AssertionError(f"no prompt after the answer; got {''.join(chunks)!r}")


def test_repl_streams_an_answer_on_a_terminal(embedded_stack: Any, client_env: dict[str, str]) -> None:
    user = unique_user()
    child = start_repl(embedded_stack.url, user, 64, client_env)
    child.expect(f"model {embedded_stack.model_name}")
    child.expect(PROMPT)
    send_turn(child, "Name three colors.")
    chunks = read_answer(child)
    transcript = "".join(chunks)

    chat = StackReader(embedded_stack.url, user).only_chat()
    answer = chat["messages"][-1]
    assert answer["role"] == "assistant" and answer["state"] == "complete"
    assert answer["content"].strip()
    # The terminal shows exactly the stored answer (the pty turns \n into \r\n) ...
    assert answer["content"].replace("\n", "\r\n").strip() in transcript
    # ... and it arrived token by token, not in one piece at the end.
    with_text = [c for c in chunks if c.strip() and PROMPT_BACK not in c]
    assert len(with_text) >= 2, chunks

    child.sendline("/quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_repl_ctrl_c_cancels_on_the_server(embedded_stack: Any, client_env: dict[str, str]) -> None:
    user = unique_user()
    # Enough tokens that the answer cannot finish between its first token and the Ctrl-C, even on a
    # busy machine (a REPL that loses that race says so, "[interrupted; the answer had already finished]").
    child = start_repl(embedded_stack.url, user, 1500, client_env)
    child.expect(PROMPT)
    child.sendline("Write a very long story about a dragon who learns to bake bread, in ten chapters.")
    # The first token: straight after the input line, or after the queue status line is cleared.
    child.expect(r"(\x1b\[\?2004l|\x1b\[2K)[^\[\x1b\r]")
    child.sendintr()
    child.expect(r"\[cancelled\]")
    child.expect(PROMPT)

    reader = StackReader(embedded_stack.url, user)
    chat = reader.only_chat()
    answer = chat["messages"][-1]
    deadline = time.monotonic() + 20
    while answer["state"] in ("pending", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.2)
        answer = reader.message(chat["id"], answer["id"])
    assert answer["state"] == "cancelled", answer

    # The REPL goes on: the next turn is answered.
    send_turn(child, "Say hi")
    read_answer(child)
    messages = reader.only_chat()["messages"]
    assert [m["role"] for m in messages] == ["prompter", "assistant", "prompter", "assistant"]
    # The stopped answer stays in the conversation and carries the next turn.
    assert messages[2]["parent_id"] == answer["id"]
    assert messages[3]["state"] == "complete"
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_unknown_model_lists_the_available_ones(embedded_stack: Any, client_env: dict[str, str]) -> None:
    result = subprocess.run(
        [OASST_CHAT, "--server-url", embedded_stack.url, "--model", "no-such-model"],
        input="hi\n",
        capture_output=True,
        text=True,
        env=client_env,
        timeout=60,
    )
    assert result.returncode != 0
    assert result.stdout == ""
    assert "unknown model 'no-such-model'" in result.stderr
    assert embedded_stack.model_name in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("mode", ["pipe", "terminal"])
def test_unreachable_server_is_a_clear_error(
    closed_port_url: str, client_env: dict[str, str], mode: str
) -> None:
    args = ["--server-url", closed_port_url]
    if mode == "pipe":
        result = subprocess.run(
            [OASST_CHAT, *args], input="hi\n", capture_output=True, text=True, env=client_env, timeout=60
        )
        assert result.returncode != 0
        assert result.stdout == ""
        output = result.stderr
    else:
        child = pexpect.spawn(OASST_CHAT, args, env=client_env, encoding="utf-8", timeout=30)
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus not in (0, None)
        output = child.before
    assert f"oasst-chat: error: cannot reach the inference server at {closed_port_url}" in output
    assert "Traceback" not in output


def test_pipe_mode_signs_in_with_an_api_key(embedded_stack: Any, client_env: dict[str, str]) -> None:
    """How the client signs in on a production server (no debug login): a user's API key."""
    user = unique_user()
    reader = StackReader(embedded_stack.url, user)
    created = reader.http.post("/api_keys", json={"name": "terminal"}).json()
    result = subprocess.run(
        [OASST_CHAT, "--server-url", embedded_stack.url, "--max-new-tokens", "24"],
        input="Say hello.\n",
        capture_output=True,
        text=True,
        env={**client_env, "OASST_API_KEY": created["key"]},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    # The answer went to the key's owner, not to the debug login's default user.
    chat = reader.only_chat()
    assert chat["messages"][-1]["content"].strip() == result.stdout.strip()

    assert reader.http.delete(f"/api_keys/{created['id']}").status_code == 204
    refused = subprocess.run(
        [OASST_CHAT, "--server-url", embedded_stack.url, "--api-key", created["key"]],
        input="Say hello.\n",
        capture_output=True,
        text=True,
        env=client_env,
        timeout=60,
    )
    assert refused.returncode == 1
    assert "the server refused the API key: invalid or revoked API key" in refused.stderr
