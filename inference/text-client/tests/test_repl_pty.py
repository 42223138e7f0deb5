"""The REPL on a real pseudo-terminal, against the scripted server (no model needed)."""

from __future__ import annotations

from pathlib import Path

import pexpect
import pytest

from .conftest import FakeChatServer

PROMPT = "you>"  # prompt_toolkit draws the trailing space as a cursor move


def spawn(chat_command: list[str], client_env: dict[str, str], *args: str) -> pexpect.spawn:
    child = pexpect.spawn(
        chat_command[0], [*chat_command[1:], *args], env=client_env, encoding="utf-8", timeout=20
    )
    child.setwinsize(50, 200)
    return child


def quit_cleanly(child: pexpect.spawn, how: str = "/quit") -> None:
    if how == "ctrl-d":
        child.sendcontrol("d")
    else:
        child.sendline(how)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before


def test_chat_commands_and_quit(
    fake_server: FakeChatServer, chat_command: list[str], client_env: dict[str, str]
) -> None:
    child = spawn(chat_command, client_env, "--server-url", fake_server.url)
    child.expect("model fake-model")
    child.expect(PROMPT)
    child.sendline("Say hi")
    child.expect("Hello, world!")
    child.expect(PROMPT)
    child.sendline("/help")
    child.expect("/new +start a new chat")
    child.expect(PROMPT)
    child.sendline("/bogus")
    child.expect("unknown command /bogus")
    child.expect(PROMPT)
    child.sendline("/new")
    child.expect(r"\[new chat\]")
    child.expect(PROMPT)
    child.sendline("again")
    child.expect("Hello, world!")
    child.expect(PROMPT)
    quit_cleanly(child)
    assert len(fake_server.chats) == 2
    history = Path(client_env["XDG_STATE_HOME"]) / "oasst-chat" / "history"
    assert "+Say hi" in history.read_text()


def test_ctrl_c_cancels_the_answer_and_the_repl_goes_on(
    fake_server: FakeChatServer, chat_command: list[str], client_env: dict[str, str]
) -> None:
    fake_server.token_delay_s = 0.5
    child = spawn(chat_command, client_env, "--server-url", fake_server.url)
    child.expect(PROMPT)
    child.sendline("tell me a long story")
    child.expect("Hello")
    child.sendintr()
    child.expect(r"\[cancelled\]")
    child.expect(PROMPT)
    assert len(fake_server.cancelled) == 1
    # Ctrl-C at the prompt only clears the line.
    child.send("half a line")
    child.sendintr()
    child.expect(PROMPT)
    fake_server.token_delay_s = 0.0
    child.sendline("next")
    child.expect("Hello, world!")
    child.expect(PROMPT)
    quit_cleanly(child, "ctrl-d")
    # The cancelled answer, with its partial text, carries the conversation on.
    prompters = [r.body for r in fake_server.requests if r.path.endswith("/prompter_message")]
    assert [p["parent_id"] for p in prompters] == [None, fake_server.cancelled[0]]


def test_ctrl_c_where_the_server_cannot_cancel(
    fake_server: FakeChatServer, chat_command: list[str], client_env: dict[str, str]
) -> None:
    fake_server.token_delay_s = 0.5
    fake_server.cancel_status = 405
    child = spawn(chat_command, client_env, "--server-url", fake_server.url)
    child.expect(PROMPT)
    child.sendline("story")
    child.expect("Hello")
    child.sendintr()
    child.expect("this server cannot cancel")
    child.expect(PROMPT)
    quit_cleanly(child)


def test_errors_keep_the_repl_alive(
    fake_server: FakeChatServer, chat_command: list[str], client_env: dict[str, str]
) -> None:
    child = spawn(chat_command, client_env, "--server-url", fake_server.url)
    child.expect(PROMPT)
    fake_server.error_event = "the model is overloaded"
    child.sendline("hi")
    child.expect("error: the model is overloaded")
    child.expect(PROMPT)
    fake_server.error_event = None
    fake_server.models = []  # the next answer is refused with a 4xx detail
    child.sendline("hi again")
    child.expect(r"error: server error 422: unknown model; available: \r?\n")
    child.expect(PROMPT)
    quit_cleanly(child, "/exit")


@pytest.mark.parametrize("flag", ["--model=missing", None])
def test_startup_errors_exit_non_zero(
    fake_server: FakeChatServer,
    closed_port_url: str,
    chat_command: list[str],
    client_env: dict[str, str],
    flag: str | None,
) -> None:
    args = ["--server-url", fake_server.url, flag] if flag else ["--server-url", closed_port_url]
    child = spawn(chat_command, client_env, *args)
    child.expect("oasst-chat: error: ")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1
