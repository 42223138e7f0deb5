"""The errors of the domain: what a service says went wrong, without HTTP in mind.

Services raise these; :mod:`.api.error_handlers` alone maps them to HTTP (a status, and the REST or the
OpenAI error shape), so a service can be used and tested without a web framework. Every error has a
machine-readable ``code`` (what clients branch on, e.g. ``invalid_refresh_token``) and a ``detail`` for
people.

    DomainError
    ├── InvalidRequest      the request cannot be served as asked: a bad cursor, a foreign OAuth state,
    │                       a parent message that does not fit, too many messages in a request (400)
    │   └── ContentRefused  the moderation hook refused the prompt (or, unstreamed, the answer) (400)
    ├── InvalidValue        a value breaks a documented bound: settings, a message or a system prompt
    │                       too long (422)
    ├── TooLarge            the request is larger than what it starts can carry: its work frame would
    │                       be over the worker socket's frame limit (413)
    ├── NotAuthenticated    no valid credentials: expired or forged token, unknown user (401)
    ├── NotPermitted        the caller is known but may not do this: a disabled feature, a wrong admin
    │                       token, a priority from an untrusted client (403)
    ├── NotFound            the thing named does not exist, or is not the caller's (404)
    ├── Conflict            the state of the data refuses the change: a full chat, too many chats (409)
    ├── RateLimited         the caller has too much going on: generations per minute or at once, open
    │                       event streams; ``retry_after`` says when to ask again (429)
    ├── ServiceUnavailable  the service cannot take the request now: no worker serves the model, its
    │                       queue is full; ``retry_after`` where it is known (503)
    ├── GenerationFailed    the work was accepted but failed: the worker reported an error, or
    │                       answered nothing usable (500)
    └── UpstreamFailed      a service this one depends on failed: an OAuth provider (502)

``ApiError`` (:mod:`.errors`) is the HTTP form the mapping produces. What is HTTP alone is mapped there
too: ``openai_api``'s ``ClientGone`` (the client closed the connection before its answer) is a 499.
"""

from __future__ import annotations


class DomainError(Exception):
    def __init__(self, code: str, detail: str, *, param: str | None = None):
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.param = param  # the request parameter at fault, where there is one


class InvalidRequest(DomainError):
    """The request cannot be served as asked."""


class ContentRefused(InvalidRequest):
    """The moderation hook refused the text; ``categories`` say what it found."""

    def __init__(self, code: str, detail: str, *, categories: list[str]):
        super().__init__(code, detail)
        self.categories = categories


class InvalidValue(DomainError):
    """A value breaks a documented bound."""


class TooLarge(DomainError):
    """The request is larger than what it starts can carry."""


class NotAuthenticated(DomainError):
    """No valid credentials. ``bearer``: the caller should send (fresh) bearer tokens."""

    def __init__(self, code: str, detail: str, *, bearer: bool = False):
        super().__init__(code, detail)
        self.bearer = bearer


class NotPermitted(DomainError):
    """The caller is known but may not do this."""


class NotFound(DomainError):
    """The thing named does not exist, or is not the caller's."""


class Conflict(DomainError):
    """The state of the data refuses the change."""


class RateLimited(DomainError):
    """The caller has reached a per-user limit; asking again after ``retry_after`` seconds may succeed."""

    def __init__(self, code: str, detail: str, *, retry_after: int):
        super().__init__(code, detail)
        self.retry_after = retry_after


class ServiceUnavailable(DomainError):
    """The service cannot take the request now; ``retry_after`` (seconds), where it is known."""

    def __init__(self, code: str, detail: str, *, retry_after: int | None = None, param: str | None = None):
        super().__init__(code, detail, param=param)
        self.retry_after = retry_after


class GenerationFailed(DomainError):
    """The work was accepted but failed, or its worker answered nothing usable."""


class UpstreamFailed(DomainError):
    """A service this one depends on failed or answered nonsense."""


def not_found(what: str) -> NotFound:
    """``what`` (e.g. ``chat``, ``api_key``) does not exist or is not the caller's."""
    return NotFound(f"{what}_not_found", f"{what.replace('_', ' ').capitalize()} not found")
