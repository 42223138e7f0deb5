"""API errors: every failure is JSON ``{"detail", "code"}`` with a fitting status, never a traceback.

``ApiError`` is raised by routes and services; the handlers here also turn request validation errors
and unexpected exceptions into the same shape.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from loguru import logger
from starlette.exceptions import HTTPException as StarletteHTTPException


class ApiError(Exception):
    def __init__(self, status_code: int, code: str, detail: str, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.status_code = status_code
        self.code = code
        self.detail = detail
        self.headers = headers


def not_found(what: str) -> ApiError:
    return ApiError(404, f"{what}_not_found", f"{what.replace('_', ' ').capitalize()} not found")


def _json_safe(errors: list[Any]) -> list[dict[str, Any]]:
    safe = []
    for e in errors:
        item = {k: v for k, v in e.items() if k in ("loc", "msg", "type")}
        item["loc"] = [str(p) for p in item.get("loc", ())]
        safe.append(item)
    return safe


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(
            {"detail": exc.detail, "code": exc.code}, status_code=exc.status_code, headers=exc.headers
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = _json_safe(list(exc.errors()))
        summary = "; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors[:3])
        return JSONResponse(
            {"detail": f"invalid request: {summary}", "code": "validation_error", "errors": errors},
            status_code=422,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed"}.get(
            exc.status_code, "http_error"
        )
        return JSONResponse(
            {"detail": str(exc.detail), "code": code},
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.opt(exception=exc).error("unhandled error on {} {}", request.method, request.url.path)
        return JSONResponse({"detail": "internal server error", "code": "internal_error"}, status_code=500)
