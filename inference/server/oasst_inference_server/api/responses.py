"""The documented error responses of the REST API (every one is an ``ErrorBody``), for ``responses=``.

``document_errors`` also rewrites FastAPI's generated OpenAPI so validation errors (422) and
unexpected ones (500) show the shape the server really sends.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from oasst_shared.schemas import ErrorBody

Responses = dict[int | str, dict[str, Any]]


def error(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


AUTH: Responses = {401: error("Not authenticated, or the token or trusted-client header is invalid")}
CHAT: Responses = {**AUTH, 404: error("No such chat for this user")}
MESSAGE: Responses = {**AUTH, 404: error("No such chat or message for this user")}
ADMIN: Responses = {
    401: error("No admin token"),
    403: error("Wrong admin token, or the admin API is disabled"),
}


def document_errors(app: FastAPI, *, skip_prefixes: tuple[str, ...] = ("/v1/",)) -> None:
    """Make the OpenAPI document show ``ErrorBody`` for 422 and 500 on every REST route, and 413 on
    every route that takes a body (``edge_guard.py``)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.setdefault(
            "ErrorBody", ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
        )
        ref = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}
        for path, operations in schema.get("paths", {}).items():
            if path.startswith(skip_prefixes):
                continue
            for operation in operations.values():
                responses = operation.setdefault("responses", {})
                if "422" in responses:
                    responses["422"] = {
                        "description": "Invalid request (the errors list names the fields)",
                        **ref,
                    }
                if "requestBody" in operation:
                    responses.setdefault(
                        "413",
                        {
                            "description": "The body is over OASST_SERVER_MAX_REQUEST_BODY_BYTES, or the "
                            "work it starts over the worker frame limit",
                            **ref,
                        },
                    )
                responses.setdefault("500", {"description": "Unexpected server error", **ref})
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
