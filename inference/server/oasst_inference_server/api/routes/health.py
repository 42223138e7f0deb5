from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from oasst_inference_server.api.deps import BrokerDep, SessionDep
from oasst_inference_server.db.engine import ping_database

router = APIRouter(tags=["health"])


@router.get("/health", responses={503: {"description": "The database or broker is unreachable"}})
async def health(session: SessionDep, broker: BrokerDep) -> JSONResponse:
    """Liveness and readiness: the database and the broker both answer."""
    checks: dict[str, str] = {}
    try:
        await ping_database(session)
        checks["database"] = "ok"
    except Exception as exc:  # any driver error means "not ready"
        checks["database"] = f"error: {type(exc).__name__}"
    try:
        checks["broker"] = "ok" if await broker.ping() else "error"
    except Exception as exc:
        checks["broker"] = f"error: {type(exc).__name__}"
    healthy = all(v == "ok" for v in checks.values())
    return JSONResponse({"status": "ok" if healthy else "unavailable", **checks}, 200 if healthy else 503)
