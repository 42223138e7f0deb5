"""The error a request fails with: ``ApiError`` (a status, a machine-readable code and a message).

Raised by routes, and by the services not yet converted to the domain errors of :mod:`.domain_errors`;
:mod:`.api.error_handlers` turns it into the JSON the client sees (``{"detail", "code"}``, or OpenAI's shape under ``/v1/``).
"""

from __future__ import annotations


class ApiError(Exception):
    def __init__(
        self,
        status_code: int,
        code: str,
        detail: str,
        headers: dict[str, str] | None = None,
        *,
        param: str | None = None,
    ):
        super().__init__(detail)
        self.status_code = status_code
        self.code = code
        self.detail = detail
        self.headers = headers
        self.param = param  # the request parameter at fault (shown in OpenAI-shaped errors)
