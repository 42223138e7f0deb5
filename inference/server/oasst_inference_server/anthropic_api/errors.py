"""Anthropic's error shape for an HTTP status: ``{"type": "error", "error": {"type", "message"}}``.

The status codes are Anthropic's, which its SDKs map to their exception classes: a validation error is a
400 (not a 422), other client errors keep their status with the type ``invalid_request_error`` (a 413
too: the error types of the current API have no other for it), and the service being unable to take a request now (no worker serves the model, its
queue is full, storage briefly unreachable: a 503 elsewhere) is a 529 ``overloaded_error``, which the
SDKs retry.
"""

from __future__ import annotations

import uuid

from oasst_inference_server.anthropic_api.schemas import AnthropicErrorDetail, AnthropicErrorResponse

OVERLOADED = 529
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    500: "api_error",
    OVERLOADED: "overloaded_error",
}
_STATUS = {422: 400, 503: OVERLOADED}


def anthropic_status(status_code: int) -> int:
    return _STATUS.get(status_code, status_code)


def error_type(status_code: int) -> str:
    """The error type of an (Anthropic) status: other 4xx are invalid requests, other 5xx API errors."""
    known = _ERROR_TYPES.get(status_code)
    if known is not None:
        return known
    return "api_error" if status_code >= 500 else "invalid_request_error"


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex[:24]}"


def error_body(
    status_code: int, message: str, request_id: str | None = None
) -> tuple[int, AnthropicErrorResponse]:
    """The status and body of an error of our ``status_code`` in Anthropic's shape."""
    status = anthropic_status(status_code)
    detail = AnthropicErrorDetail(type=error_type(status), message=message)
    return status, AnthropicErrorResponse(error=detail, request_id=request_id or new_request_id())
