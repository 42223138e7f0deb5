"""The admin routes: load a model config of the registry, or unload the model, while the backend runs.

They take a config's name, never a path: what can be loaded is what the operator's registry lists. With
``admin_token`` set they need ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import hmac

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from oasst_cpu_backend.loading import LoadError
from oasst_cpu_backend.model_host import LoadFailed, LoadInProgress, ModelHost, UnknownModelConfig
from oasst_cpu_backend.responses import error_response
from oasst_cpu_backend.routes import parse_body


class LoadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_config_name: str = Field(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9_.:/@+-]+$",
        description="A config of the registry.",
    )


def install_admin_routes(app: FastAPI) -> None:
    @app.post("/admin/load", summary="Serve a model config of the registry (unloads the current model first)")
    async def load(request: Request) -> Response:
        refused = _refuse_unauthorized(request)
        if refused is not None:
            return refused
        body = await parse_body(request, LoadRequest, limit=4096)
        host = _host(request)
        try:
            loaded = await host.load(body.model_config_name)
        except UnknownModelConfig as exc:
            return JSONResponse({"error": str(exc), "error_type": "unknown_model_config"}, status_code=404)
        except LoadError as exc:
            return error_response(str(exc), "validation")
        except LoadInProgress as exc:
            return JSONResponse({"error": str(exc), "error_type": "load_in_progress"}, status_code=409)
        except LoadFailed as exc:
            body_ = {"error": str(exc), "error_type": "load_failed", "fallback": exc.fallback}
            return JSONResponse(body_, status_code=500)
        return JSONResponse(
            {
                "status": "ok",
                "model": loaded.plan.name,
                "model_id": loaded.plan.model_id,
                "quantization": loaded.file_type,
                "file": str(loaded.path),
                "file_bytes": loaded.path.stat().st_size,
                "context_length": loaded.engine.n_ctx,
                "load_seconds": round(loaded.seconds, 3),
            }
        )

    @app.post("/admin/unload", summary="Stop serving the model (requests get 503 until a load)")
    async def unload(request: Request) -> Response:
        refused = _refuse_unauthorized(request)
        if refused is not None:
            return refused
        try:
            await _host(request).unload()
        except LoadInProgress as exc:
            return JSONResponse({"error": str(exc), "error_type": "load_in_progress"}, status_code=409)
        return JSONResponse({"status": "unloaded"})


def _host(request: Request) -> ModelHost:
    host: ModelHost = request.app.state.model_host
    return host


def _refuse_unauthorized(request: Request) -> Response | None:
    token = _host(request).settings.admin_token
    if token is None:
        return None
    given = request.headers.get("authorization", "")
    if hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        return None
    return JSONResponse(
        {"error": "admin routes need Authorization: Bearer <admin_token>", "error_type": "unauthorized"},
        status_code=401,
    )
