"""API errors: every failure is JSON ``{"detail", "code"}`` with a fitting status, never a traceback.

The domain errors of :mod:`oasst_inference_server.domain_errors` (raised by services) get their status
here (``DOMAIN_STATUS``); ``ApiError`` (:mod:`oasst_inference_server.errors`) carries its own; a client
that left before its answer (``ClientGone``) is a 499. The handlers turn them, request validation errors
and unexpected exceptions into that shape. Under ``/v1/`` (the OpenAI-compatible API) the same errors take
OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, with the status codes the OpenAI SDKs
map to their exception classes (a validation error is a 400 there, not a 422). Under ``/v1/messages``
(the Anthropic Messages API) they take Anthropic's shape and status codes instead.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from loguru import logger
from starlette.exceptions import HTTPException as StarletteHTTPException

from oasst_inference_server import domain_errors as de
from oasst_inference_server.anthropic_api.errors import error_body as anthropic_error_body
from oasst_inference_server.errors import ApiError
from oasst_inference_server.openai_api.openai_service import ClientGone
from oasst_inference_server.openai_protocol.errors import ErrorInfo, ErrorResponse
from oasst_inference_server.outages import RETRY_AFTER_SECONDS, is_outage

OPENAI_PATH_PREFIX = "/v1/"
_OPENAI_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


# The HTTP status of each domain error; test_error_mapping checks that every one has a status.
DOMAIN_STATUS: dict[type[de.DomainError], int] = {
    de.InvalidRequest: 400,
    de.InvalidValue: 422,
    de.TooLarge: 413,
    de.NotAuthenticated: 401,
    de.NotPermitted: 403,
    de.NotFound: 404,
    de.Conflict: 409,
    de.RateLimited: 429,
    de.ServiceUnavailable: 503,
    de.GenerationFailed: 500,
    de.UpstreamFailed: 502,
}


def to_api_error(exc: de.DomainError) -> ApiError:
    """The HTTP form of a domain error."""
    status = next(s for cls, s in DOMAIN_STATUS.items() if isinstance(exc, cls))
    headers: dict[str, str] | None = None
    if isinstance(exc, de.NotAuthenticated) and exc.bearer:
        headers = {"WWW-Authenticate": "Bearer"}
    elif isinstance(exc, de.RateLimited | de.ServiceUnavailable) and exc.retry_after is not None:
        headers = {"Retry-After": str(exc.retry_after)}
    return ApiError(status, exc.code, exc.detail, headers, param=exc.param)


def is_anthropic_path(path: str) -> bool:
    """``/v1/messages`` and below: the Anthropic Messages API, whose errors take Anthropic's shape."""
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def anthropic_error(status_code: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """An error in Anthropic's shape, with its status (a 422 is a 400, a 503 a 529 overloaded_error)."""
    status, body = anthropic_error_body(status_code, message)
    request_id = {"request-id": body.request_id or ""}
    return JSONResponse(body.model_dump(), status_code=status, headers={**(headers or {}), **request_id})


def _anthropic_validation_error(errors: list[dict[str, Any]]) -> JSONResponse:
    first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
    loc = first["loc"][1:] if first["loc"][:1] == ["body"] else first["loc"]
    # pydantic names the union member it tried (``list[...]``, ``function-after[...]``): not a field
    where = ".".join(part for part in loc if "[" not in part and part not in ("str", "int", "float"))
    message = str(first["msg"]).removeprefix("Value error, ")
    return anthropic_error(400, f"{where}: {message}" if where else message)


def _json_safe(errors: list[Any]) -> list[dict[str, Any]]:
    safe = []
    for e in errors:
        item = {k: v for k, v in e.items() if k in ("loc", "msg", "type")}
        item["loc"] = [str(p) for p in item.get("loc", ())]
        safe.append(item)
    return safe


def openai_error(
    status_code: int,
    message: str,
    code: str | None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """An error in OpenAI's shape; 422 becomes 400, which is what OpenAI answers for bad parameters."""
    status_code = 400 if status_code == 422 else status_code
    error_type = _OPENAI_ERROR_TYPES.get(status_code, "server_error" if status_code >= 500 else "api_error")
    body = ErrorResponse(error=ErrorInfo(message=message, type=error_type, param=param, code=code))
    return JSONResponse(body.model_dump(), status_code=status_code, headers=headers)


def error_response(
    path: str, status_code: int, code: str, detail: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """An error in the shape of the API ``path`` belongs to, for the edge's refusals (which answer
    before any route, outside the exception handlers)."""
    if is_anthropic_path(path):
        return anthropic_error(status_code, detail, headers)
    if path.startswith(OPENAI_PATH_PREFIX):
        return openai_error(status_code, detail, code, headers=headers)
    return JSONResponse({"detail": detail, "code": code}, status_code=status_code, headers=headers)


# Outside /v1/ and in OpenAI's error shape: vLLM's and Cohere's paths (tokenize, rerank, score).
OPENAI_SHAPED_PATHS = frozenset({"/tokenize", "/detokenize", "/rerank", "/v2/rerank", "/score"})


def _is_openai(request: Request) -> bool:
    path = request.url.path
    return path.startswith(OPENAI_PATH_PREFIX) or path in OPENAI_SHAPED_PATHS


def _openai_validation_error(errors: list[dict[str, Any]]) -> JSONResponse:
    first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
    path = ""
    for part in first["loc"][1:] if first["loc"][:1] == ["body"] else first["loc"]:
        path += f"[{part}]" if part.isdigit() else f".{part}" if path else part
    message = str(first["msg"]).removeprefix("Value error, ")
    if path and path not in message:
        message = f"{path}: {message}"
    return openai_error(400, message, "invalid_value" if path else "invalid_request", path or None)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(de.DomainError)
    async def _domain_error(request: Request, exc: de.DomainError) -> JSONResponse:
        return await _api_error(request, to_api_error(exc))

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        if is_anthropic_path(request.url.path):
            return anthropic_error(exc.status_code, exc.detail, exc.headers)
        if _is_openai(request):
            return openai_error(exc.status_code, exc.detail, exc.code, exc.param, exc.headers)
        return JSONResponse(
            {"detail": exc.detail, "code": exc.code}, status_code=exc.status_code, headers=exc.headers
        )

    @app.exception_handler(ClientGone)
    async def _client_gone(request: Request, exc: ClientGone) -> JSONResponse:
        # HTTP alone has a status for it (nginx's 499): nobody reads it, but the access log does.
        return await _api_error(
            request, ApiError(499, "client_closed_request", "the client closed the connection")
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = _json_safe(list(exc.errors()))
        if is_anthropic_path(request.url.path):
            return _anthropic_validation_error(errors)
        if _is_openai(request):
            return _openai_validation_error(errors)
        summary = "; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors[:3])
        return JSONResponse(
            {"detail": f"invalid request: {summary}", "code": "validation_error", "errors": errors},
            status_code=422,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed"}.get(
            exc.status_code, "http_error"
        )
        if is_anthropic_path(request.url.path):
            return anthropic_error(exc.status_code, str(exc.detail), getattr(exc, "headers", None))
        if _is_openai(request):
            return openai_error(exc.status_code, str(exc.detail), code, headers=getattr(exc, "headers", None))
        return JSONResponse(
            {"detail": str(exc.detail), "code": code},
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Starlette re-raises the exception after this answer and uvicorn then closes the connection
        # (what else the request left unread is unknown): the answer says so.
        close = {"Connection": "close"}
        if is_outage(exc):
            # The database or the broker is briefly unreachable: ask again later, not a server fault.
            logger.warning(
                "{} {}: storage unavailable: {}: {}",
                request.method,
                request.url.path,
                type(exc).__name__,
                exc,
            )
            headers = {"Retry-After": str(RETRY_AFTER_SECONDS), **close}
            detail = "the service is briefly unavailable; retry shortly"
            if is_anthropic_path(request.url.path):
                return anthropic_error(503, detail, headers)
            if _is_openai(request):
                return openai_error(503, detail, "service_unavailable", headers=headers)
            return JSONResponse(
                {"detail": detail, "code": "service_unavailable"}, status_code=503, headers=headers
            )
        logger.opt(exception=exc).error("unhandled error on {} {}", request.method, request.url.path)
        if is_anthropic_path(request.url.path):
            return anthropic_error(500, "internal server error", close)
        if _is_openai(request):
            return openai_error(500, "internal server error", "internal_error", headers=close)
        return JSONResponse(
            {"detail": "internal server error", "code": "internal_error"}, status_code=500, headers=close
        )
