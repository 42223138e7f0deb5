"""Pipe mode: each line of input is one user turn of one chat; only the answers go to stdout.

Standard output gets each answer's text followed by a line break, and nothing else; queue position
(on a terminal only), notices and errors go to standard error. The first failed turn ends the run
with exit status 1, since later turns would lose their context.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TextIO

from oasst_shared.schemas import MessageRead, MessageState
from oasst_text_client._exceptions import TextClientError
from oasst_text_client.session import ChatSession
from oasst_text_client.status import StatusLine, queue_text

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_INTERRUPTED = 130


class PipeSink:
    """Streams tokens to stdout, or with ``buffer`` holds them until the answer is final."""

    def __init__(self, stdout: TextIO, stderr: TextIO, buffer: bool = False) -> None:
        self._stdout = stdout
        self._stderr = stderr
        self._buffer = buffer
        self._status = StatusLine(stderr)
        self._parts: list[str] = []
        self._last_char = ""  # of the text written to stdout for this answer

    def pending(self, queue_position: int, queue_size: int) -> None:
        self._status.show(queue_text(queue_position, queue_size))

    def token(self, text: str) -> None:
        self._status.clear()
        if self._buffer:
            self._parts.append(text)
            return
        self._stdout.write(text)
        self._stdout.flush()
        if text:
            self._last_char = text[-1]

    def restart(self, attempt: int, reason: str) -> None:
        self._status.clear()
        self._parts.clear()
        if self._last_char:
            # Text already written cannot be taken back; start the new attempt on its own line and say so.
            self._stdout.write("\n")
            self._stdout.flush()
            self._last_char = ""
            self._stderr.write(
                f"oasst-chat: the answer was restarted on another worker (attempt {attempt}: {reason}); "
                "the partial line above is void (use --buffer to avoid this)\n"
            )
        else:
            self._stderr.write(f"oasst-chat: the answer was restarted (attempt {attempt}: {reason})\n")
        self._stderr.flush()

    def finish(self, message: MessageRead) -> None:
        self._status.clear()
        if self._buffer:
            text = message.content if message.content is not None else "".join(self._parts)
            self._stdout.write(text if text.endswith("\n") else text + "\n")
        elif self._last_char != "\n":
            self._stdout.write("\n")
        self._stdout.flush()

    def abandon(self) -> None:
        """The answer failed: end a half-written line so the error message stands apart."""
        self._status.clear()
        if self._last_char and self._last_char != "\n":
            self._stdout.write("\n")
            self._stdout.flush()


def run_pipe(
    session: ChatSession, lines: Iterable[str], stdout: TextIO, stderr: TextIO, buffer: bool = False
) -> int:
    for raw in lines:
        text = raw.rstrip("\r\n")
        if not text.strip():
            continue
        sink = PipeSink(stdout, stderr, buffer)
        try:
            final = session.ask(text, sink)
        except TextClientError as exc:
            sink.abandon()
            stderr.write(f"oasst-chat: error: {exc}\n")
            stderr.flush()
            return EXIT_ERROR
        except KeyboardInterrupt:
            sink.abandon()
            _cancel_quietly(session, stderr)
            return EXIT_INTERRUPTED
        if final.state != MessageState.complete:
            # Cancelled from elsewhere (the web chat, another client): the answer is not whole.
            sink.abandon()
            stderr.write(f"oasst-chat: error: the answer was {final.state.value}\n")
            stderr.flush()
            return EXIT_ERROR
        sink.finish(final)
    return EXIT_OK


def _cancel_quietly(session: ChatSession, stderr: TextIO) -> None:
    try:
        cancelled = session.cancel_current(wait_s=0.0)  # about to exit: no next turn to carry
    except (TextClientError, KeyboardInterrupt) as exc:
        stderr.write(f"oasst-chat: could not cancel the answer: {exc or 'interrupted'}\n")
        return
    if cancelled is False:
        stderr.write("oasst-chat: this server cannot cancel; the answer finishes in the background\n")
    stderr.write("oasst-chat: interrupted\n")
    stderr.flush()
