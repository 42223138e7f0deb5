"""Pipe mode and the conversation logic, in process and as a subprocess, against the scripted server."""

from __future__ import annotations

import io
import signal
import subprocess
from collections.abc import Iterator

import pytest

from oasst_shared.sampling import SamplingParameters
from oasst_text_client import ApiError, ChatApiClient, ChatSession, GenerationFailed
from oasst_text_client.pipe import PipeSink, run_pipe
from oasst_text_client.repl import Repl

from .conftest import Connection, FakeChatServer


class RecordingSink:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def pending(self, queue_position: int, queue_size: int) -> None:
        self.calls.append(("pending", str(queue_position), str(queue_size)))

    def token(self, text: str) -> None:
        self.calls.append(("token", text))

    def restart(self, attempt: int, reason: str) -> None:
        self.calls.append(("restart", str(attempt), reason))


@pytest.fixture
def session(fake_server: FakeChatServer) -> Iterator[ChatSession]:
    with ChatApiClient(fake_server.url) as api:
        api.login("tester")
        yield ChatSession(api, "fake-model", SamplingParameters(max_new_tokens=16), system_prompt=None)


def posted(fake_server: FakeChatServer, suffix: str) -> list[dict[str, object]]:
    return [r.body for r in fake_server.requests if r.method == "POST" and r.path.endswith(suffix)]


def test_turns_chain_under_the_previous_answer(session: ChatSession, fake_server: FakeChatServer) -> None:
    sink = RecordingSink()
    first = session.ask("one", sink)
    second = session.ask("two", sink)
    assert first.content == second.content == "Hello, world!"
    assert sink.calls[:2] == [("pending", "1", "2"), ("token", "Hello")]
    prompters = posted(fake_server, "/prompter_message")
    assert [p["parent_id"] for p in prompters] == [None, first.id]
    assert len(fake_server.chats) == 1


def test_a_failed_first_turn_starts_a_new_chat(session: ChatSession, fake_server: FakeChatServer) -> None:
    fake_server.error_event = "the worker crashed"
    with pytest.raises(GenerationFailed, match="the worker crashed"):
        session.ask("one", RecordingSink())
    assert session.current is None
    fake_server.error_event = None
    session.ask("two", RecordingSink())
    # The first chat holds a root message already; a second root would be refused.
    assert len(fake_server.chats) == 2


def test_a_failed_later_turn_branches_from_the_last_answer(
    session: ChatSession, fake_server: FakeChatServer
) -> None:
    first = session.ask("one", RecordingSink())
    fake_server.final_state = "aborted_by_worker"
    with pytest.raises(GenerationFailed, match="state aborted_by_worker"):
        session.ask("two", RecordingSink())
    fake_server.final_state = "complete"
    session.ask("three", RecordingSink())
    assert [p["parent_id"] for p in posted(fake_server, "/prompter_message")] == [None, first.id, first.id]
    assert len(fake_server.chats) == 1


def test_new_chat(session: ChatSession, fake_server: FakeChatServer) -> None:
    session.ask("one", RecordingSink())
    session.new_chat()
    session.ask("two", RecordingSink())
    assert len(fake_server.chats) == 2
    assert [p["parent_id"] for p in posted(fake_server, "/prompter_message")] == [None, None]


class InterruptingSink(RecordingSink):
    """Stands for the user pressing Ctrl-C when the first token shows."""

    def token(self, text: str) -> None:
        raise KeyboardInterrupt


def test_a_cancelled_answer_carries_the_next_turn(session: ChatSession, fake_server: FakeChatServer) -> None:
    with pytest.raises(KeyboardInterrupt):
        session.ask("one", InterruptingSink())
    assert session.current is not None
    cancelled_id = session.current[1]
    assert session.cancel_current() is True
    assert fake_server.cancelled == [cancelled_id]
    assert session.cancel_current() is None  # nothing in progress any more
    session.ask("two", RecordingSink())
    assert [p["parent_id"] for p in posted(fake_server, "/prompter_message")] == [None, cancelled_id]
    assert len(fake_server.chats) == 1


def test_an_answer_cancelled_before_any_text_is_left_out(
    session: ChatSession, fake_server: FakeChatServer
) -> None:
    first = session.ask("one", RecordingSink())
    fake_server.cancel_content = None
    with pytest.raises(KeyboardInterrupt):
        session.ask("two", InterruptingSink())
    assert session.cancel_current() is True
    session.ask("three", RecordingSink())
    assert [p["parent_id"] for p in posted(fake_server, "/prompter_message")] == [None, first.id, first.id]


def test_a_cancel_that_loses_the_race_says_so(session: ChatSession, fake_server: FakeChatServer) -> None:
    fake_server.cancel_status = 409  # the answer finished between the Ctrl-C and the cancel
    with pytest.raises(KeyboardInterrupt):
        session.ask("one", InterruptingSink())
    out = io.StringIO()
    note = Repl(session, out)._cancel()
    assert note == "[interrupted; the answer had already finished]"
    # The message the cancel hit, as the server has it (not taken from the client under test).
    assert len(fake_server.cancelled) == 1
    finished_id = fake_server.cancelled[0]
    assert fake_server.messages[finished_id]["state"] == "complete"
    assert session.last_cancelled is not None and session.last_cancelled.state == "complete"
    # The whole answer carries the next turn.
    session.ask("two", RecordingSink())
    assert [p["parent_id"] for p in posted(fake_server, "/prompter_message")] == [None, finished_id]


def test_where_the_server_cannot_cancel(session: ChatSession, fake_server: FakeChatServer) -> None:
    fake_server.cancel_status = 405
    with pytest.raises(KeyboardInterrupt):
        session.ask("one", InterruptingSink())
    assert session.cancel_current() is False
    session.ask("two", RecordingSink())
    # The interrupted answer is still generating, so cannot be replied to: a new chat it is.
    assert len(fake_server.chats) == 2


def test_an_answer_cancelled_elsewhere(session: ChatSession, fake_server: FakeChatServer) -> None:
    fake_server.final_state = "cancelled"
    assert session.ask("one", RecordingSink()).state == "cancelled"
    out, err = io.StringIO(), io.StringIO()
    assert run_pipe(session, ["two\n"], out, err) == 1
    assert out.getvalue() == "Hello, world!\n"
    assert err.getvalue() == "oasst-chat: error: the answer was cancelled\n"


def test_pipe_writes_only_the_answers(session: ChatSession) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert run_pipe(session, ["first\n", "\n", "   \n", "second\r\n"], out, err) == 0
    assert out.getvalue() == "Hello, world!\nHello, world!\n"
    assert err.getvalue() == ""


def test_pipe_stops_at_the_first_error(session: ChatSession, fake_server: FakeChatServer) -> None:
    fake_server.error_event = "no worker for model fake-model"
    out, err = io.StringIO(), io.StringIO()
    assert run_pipe(session, ["first\n", "second\n"], out, err) == 1
    # The tokens before the error were written; the line is ended so stdout stays line-based.
    assert out.getvalue() == "Hello, world!\n"
    assert err.getvalue() == "oasst-chat: error: no worker for model fake-model\n"
    assert len(posted(fake_server, "/prompter_message")) == 1


def test_pipe_on_a_restarted_answer(session: ChatSession, fake_server: FakeChatServer) -> None:
    fake_server.retry_after_tokens = 2
    out, err = io.StringIO(), io.StringIO()
    assert run_pipe(session, ["hi\n"], out, err) == 0
    assert out.getvalue() == "Hello,\nHello, world!\n"
    assert "restarted on another worker (attempt 2: worker disconnected)" in err.getvalue()

    out, err = io.StringIO(), io.StringIO()
    assert run_pipe(session, ["hi\n"], out, err, buffer=True) == 0
    assert out.getvalue() == "Hello, world!\n"


def test_pipe_sink_does_not_double_a_final_newline() -> None:
    out, err = io.StringIO(), io.StringIO()
    sink = PipeSink(out, err)
    sink.token("line\n")
    sink.abandon()
    assert out.getvalue() == "line\n"


# ---------------------------------------------------------------- the command, as a process


def run_chat(
    chat_command: list[str], client_env: dict[str, str], args: list[str], stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*chat_command, *args], input=stdin, capture_output=True, text=True, env=client_env, timeout=60
    )


def test_command_pipe_mode(
    fake_server: FakeChatServer, chat_command: list[str], client_env: dict[str, str]
) -> None:
    result = run_chat(
        chat_command, client_env, ["--server-url", fake_server.url, "--seed=3"], "Say hi\n2+2?\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Hello, world!\nHello, world!\n"
    assert "Traceback" not in result.stderr
    sampling = posted(fake_server, "/assistant_message")[0]["sampling_parameters"]
    # The model's preset, with the flag on top.
    assert sampling == {"temperature": 0.7, "max_new_tokens": 64, "seed": 3, "stop": []}


def test_command_server_url_from_environment(
    fake_server: FakeChatServer, chat_command: list[str], client_env: dict[str, str]
) -> None:
    client_env["OASST_SERVER_URL"] = fake_server.url
    result = run_chat(chat_command, client_env, ["--model", "other-model"], "hi\n")
    assert result.returncode == 0, result.stderr
    assert posted(fake_server, "/assistant_message")[0]["model_config_name"] == "other-model"


def test_command_unknown_model(
    fake_server: FakeChatServer, chat_command: list[str], client_env: dict[str, str]
) -> None:
    result = run_chat(chat_command, client_env, ["--server-url", fake_server.url, "--model", "gpt-9"], "hi\n")
    assert result.returncode == 1
    assert result.stdout == ""
    assert "unknown model 'gpt-9'; available models: fake-model, other-model" in result.stderr
    assert posted(fake_server, "/prompter_message") == []


def test_command_no_model_available(
    fake_server: FakeChatServer, chat_command: list[str], client_env: dict[str, str]
) -> None:
    fake_server.models = []
    result = run_chat(chat_command, client_env, ["--server-url", fake_server.url], "hi\n")
    assert result.returncode == 1
    assert "no model is available on the server" in result.stderr


def test_command_unreachable_server(
    closed_port_url: str, chat_command: list[str], client_env: dict[str, str]
) -> None:
    result = run_chat(chat_command, client_env, ["--server-url", closed_port_url], "hi\n")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith(
        f"oasst-chat: error: cannot reach the inference server at {closed_port_url}"
    )
    assert result.stderr.count("\n") == 1


def test_command_shows_the_servers_detail(
    fake_server: FakeChatServer, chat_command: list[str], client_env: dict[str, str]
) -> None:
    fake_server.login_status = 403
    result = run_chat(chat_command, client_env, ["--server-url", fake_server.url], "hi\n")
    assert result.returncode == 1
    assert result.stderr == "oasst-chat: error: server error 403: debug login is disabled\n"


def test_command_list_models(
    fake_server: FakeChatServer, chat_command: list[str], client_env: dict[str, str]
) -> None:
    result = run_chat(chat_command, client_env, ["--server-url", fake_server.url, "--list-models"])
    assert result.returncode == 0
    assert result.stdout.splitlines() == ["fake-model\t1 worker\ta canned answer", "other-model\t2 workers"]


def test_command_bad_flag_is_a_usage_error(chat_command: list[str], client_env: dict[str, str]) -> None:
    result = run_chat(chat_command, client_env, ["--top-p", "7"])
    assert result.returncode == 2
    assert "--top-p: Input should be less than or equal to 1" in result.stderr


def test_command_ctrl_c_in_pipe_mode_cancels_and_exits_130(
    fake_server: FakeChatServer, chat_command: list[str], client_env: dict[str, str]
) -> None:
    fake_server.token_delay_s = 0.5
    proc = subprocess.Popen(
        [*chat_command, "--server-url", fake_server.url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=client_env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("tell me a story\n")
    proc.stdin.close()
    assert proc.stdout.read(5) == "Hello"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    assert proc.stderr is not None
    err = proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    assert err.endswith("oasst-chat: interrupted\n")
    assert "Traceback" not in err
    assert len(fake_server.cancelled) == 1


# ---------------------------------------------------------------- one call per turn


def requested_paths(fake_server: FakeChatServer) -> list[str]:
    return [f"{r.method} {r.path.split('?')[0]}" for r in fake_server.requests if "/chats/" in r.path]


def test_a_server_with_turns_gets_one_call_per_turn(
    session: ChatSession, fake_server: FakeChatServer
) -> None:
    fake_server.turns = True
    first = session.ask("one", RecordingSink())
    second = session.ask("two", RecordingSink())
    assert first.content == second.content == "Hello, world!"
    turns = posted(fake_server, "/turns")
    assert [t["parent_id"] for t in turns] == [None, first.id] and turns[1]["content"] == "two"
    assert turns[0]["sampling_parameters"]["max_new_tokens"] == 16
    assert not posted(fake_server, "/prompter_message") and not posted(fake_server, "/assistant_message")
    assert not [p for p in requested_paths(fake_server) if p.endswith("/events")]


def test_a_broken_turn_stream_resumes_from_the_answer_s_events(
    session: ChatSession, fake_server: FakeChatServer
) -> None:
    fake_server.turns = True
    fake_server.connections = [Connection(kind="abort_after", after=2)]  # created, pending, "Hello", cut
    sink = RecordingSink()
    final = session.ask("one", sink)
    assert "".join(c[1] for c in sink.calls if c[0] == "token") == "Hello, world!"  # each token once
    resumed = [r for r in fake_server.requests if r.method == "GET" and r.path.endswith("/events")]
    assert len(resumed) == 1 and resumed[0].path == f"/chats/{final.chat_id}/messages/{final.id}/events"
    assert resumed[0].headers["Last-Event-ID"] == "2-0"
    assert len(posted(fake_server, "/turns")) == 1  # the turn itself is never sent twice


def test_a_refused_turn_is_an_error_not_a_fallback(session: ChatSession, fake_server: FakeChatServer) -> None:
    fake_server.turns = True
    session.model_name = "no-such-model"
    with pytest.raises(ApiError) as refused:
        session.ask("one", RecordingSink())
    assert refused.value.code == "unknown_model"
    assert not posted(fake_server, "/prompter_message")


def test_a_server_without_turns_gets_the_three_calls(
    session: ChatSession, fake_server: FakeChatServer
) -> None:
    session.ask("one", RecordingSink())
    session.ask("two", RecordingSink())
    assert len(posted(fake_server, "/turns")) == 1  # asked once, then remembered
    assert (
        len(posted(fake_server, "/prompter_message")) == len(posted(fake_server, "/assistant_message")) == 2
    )
