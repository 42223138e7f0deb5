"""The errors of the text client. Every one carries a message fit to show a user as is.

    TextClientError
    ├── ServerUnreachable       the server cannot be reached (refused, DNS, timeout, dropped)
    ├── ApiError                the server answered 4xx/5xx; ``detail`` and ``code`` from its JSON body
    ├── ProtocolError           the server answered something this client cannot read
    ├── ModelUnavailable        the named model is unknown, or no model has a worker; lists the others
    ├── GenerationFailed        the answer ended with an error event or a non-complete state
    ├── StreamInterrupted       the event stream broke and reconnecting did not bring it back
    └── UsageError              bad command-line input found after argument parsing

httpx errors are mapped to these at the boundary (``api.py``), so the REPL and pipe mode catch one type.
"""

from __future__ import annotations


class TextClientError(Exception):
    """Base class; ``str(error)`` is the one-line message for the user."""


class ServerUnreachable(TextClientError):
    pass


class ApiError(TextClientError):
    def __init__(self, status_code: int, detail: str, code: str | None = None) -> None:
        self.status_code = status_code
        self.detail = detail
        self.code = code
        super().__init__(f"server error {status_code}: {detail}")


class ProtocolError(TextClientError):
    pass


class ModelUnavailable(TextClientError):
    def __init__(self, message: str, available: list[str]) -> None:
        self.available = available
        super().__init__(message)


class GenerationFailed(TextClientError):
    def __init__(self, message: str, state: str | None = None) -> None:
        self.state = state
        super().__init__(message)


class StreamInterrupted(TextClientError):
    pass


class UsageError(TextClientError):
    pass
