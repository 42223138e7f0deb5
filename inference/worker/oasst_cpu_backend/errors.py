"""How errors become TGI-shaped answers: refused input (422), overload (429/503), anything unexpected
(500, logged)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from loguru import logger
from starlette.exceptions import HTTPException as StarletteHTTPException

from oasst_cpu_backend.responses import error_response
from oasst_cpu_backend.scheduler import OverloadedError, ShuttingDownError
from oasst_cpu_backend.state import serving_state_if_ready
from oasst_cpu_backend.validation import InvalidRequest


def install_error_handlers(app: FastAPI) -> None:
    async def invalid(request: Request, exc: Exception) -> Response:
        serving = serving_state_if_ready(request)
        if serving is not None:
            serving.metrics.requests.labels(outcome="validation_error").inc()
        return error_response(str(exc), "validation")

    async def overloaded(request: Request, exc: Exception) -> Response:
        status = 503 if isinstance(exc, ShuttingDownError) else 429
        return error_response(str(exc), "overloaded", status, headers={"Retry-After": "1"})

    async def fastapi_validation(request: Request, exc: Exception) -> Response:
        return error_response(f"Input validation error: {exc}", "validation")

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    async def unexpected(request: Request, exc: Exception) -> Response:
        logger.opt(exception=exc).error("unexpected error on {} {}", request.method, request.url.path)
        return error_response(f"internal error: {type(exc).__name__}", "generation", status_code=500)

    app.add_exception_handler(InvalidRequest, invalid)
    app.add_exception_handler(OverloadedError, overloaded)
    app.add_exception_handler(RequestValidationError, fastapi_validation)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)
