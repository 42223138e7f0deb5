"""The interactive REPL: prompt_toolkit for input (history, line editing), answers streamed to the terminal.

Ctrl-C while an answer streams cancels that generation on the server and returns to the prompt;
Ctrl-C at the prompt clears the line; Ctrl-D or /quit leaves. Errors are shown on one line and the
REPL carries on.
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from prompt_toolkit import PromptSession
from prompt_toolkit.history import FileHistory, History, InMemoryHistory

from oasst_shared.schemas import MessageRead, MessageState
from oasst_text_client._exceptions import TextClientError
from oasst_text_client.session import ChatSession
from oasst_text_client.status import StatusLine, queue_text

PROMPT = "you> "
HELP = """\
Type a message and press Enter to send it. Commands:
  /new    start a new chat (forget the conversation so far)
  /help   show this help
  /quit   leave (so does Ctrl-D); /exit works too
Ctrl-C while an answer is being written stops it; Ctrl-C at the prompt clears the line."""


class ReplSink:
    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._status = StatusLine(out)
        self._last_char = ""

    def pending(self, queue_position: int, queue_size: int) -> None:
        self._status.show(queue_text(queue_position, queue_size))

    def token(self, text: str) -> None:
        self._status.clear()
        self._write(text)

    def restart(self, attempt: int, reason: str) -> None:
        self._status.clear()
        self.end_line()
        self._write(
            f"[the server lost the worker ({reason}); starting the answer again, attempt {attempt}]\n"
        )

    def finish(self, message: MessageRead) -> None:
        self._status.clear()
        self.end_line()
        if message.state == MessageState.cancelled:
            self._write("[cancelled]\n")
        elif message.finish_reason == "length":
            self._write("[stopped at the length limit]\n")

    def note(self, text: str) -> None:
        self._status.clear()
        self.end_line()
        self._write(f"{text}\n")

    def end_line(self) -> None:
        if self._last_char and self._last_char != "\n":
            self._write("\n")

    def _write(self, text: str) -> None:
        if not text:
            return
        self._out.write(text)
        self._out.flush()
        self._last_char = text[-1]


def open_history(path: Path | None) -> History:
    if path is None:
        return InMemoryHistory()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)
    except OSError:
        # A read-only home must not stop the chat; history is a convenience.
        return InMemoryHistory()
    return FileHistory(str(path))


class Repl:
    def __init__(
        self,
        session: ChatSession,
        out: TextIO,
        history: History | None = None,
        prompt_session: PromptSession[str] | None = None,
    ) -> None:
        self.session = session
        self.out = out
        self.prompt = prompt_session or PromptSession(history=history or InMemoryHistory())

    def run(self, banner: str | None = None) -> int:
        if banner:
            self._print(banner)
        while True:
            try:
                line = self.prompt.prompt(PROMPT)
            except KeyboardInterrupt:
                continue
            except EOFError:
                break
            text = line.strip()
            if not text:
                continue
            if text.startswith("/"):
                if not self._command(text):
                    break
                continue
            self.ask(text)
        return 0

    def ask(self, text: str) -> None:
        sink = ReplSink(self.out)
        try:
            final = self.session.ask(text, sink)
        except TextClientError as exc:
            sink.note(f"error: {exc}")
            return
        except KeyboardInterrupt:
            sink.note(self._cancel())
            return
        sink.finish(final)

    def _cancel(self) -> str:
        try:
            cancelled = self.session.cancel_current()
        except TextClientError as exc:
            return f"[interrupted; cancelling failed: {exc}]"
        except KeyboardInterrupt:
            return "[interrupted]"
        if cancelled is None:
            return "[interrupted]"
        if cancelled:
            finished = self.session.last_cancelled
            if finished is not None and finished.state == MessageState.complete:
                return "[interrupted; the answer had already finished]"
            return "[cancelled]"
        return "[interrupted; this server cannot cancel, the answer finishes in the background]"

    def _command(self, text: str) -> bool:
        """Run a /command; False means leave the REPL."""
        name = text.split()[0].lower()
        if name in ("/quit", "/exit"):
            return False
        if name == "/new":
            self.session.new_chat()
            self._print("[new chat]")
        elif name == "/help":
            self._print(HELP)
        else:
            self._print(f"unknown command {name}; /help lists the commands")
        return True

    def _print(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()
