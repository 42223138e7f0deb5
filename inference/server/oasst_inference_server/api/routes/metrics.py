"""``/metrics`` for Prometheus, included only when ``settings.metrics_enabled`` (production: off unless
configured); with ``settings.metrics_token`` set it asks for that bearer token."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from oasst_inference_server import metrics
from oasst_inference_server.api.deps import BrokerDep, SessionFactoryDep, SettingsDep
from oasst_inference_server.api.responses import error
from oasst_inference_server.domain_errors import NotAuthenticated
from oasst_inference_server.scheduling.queue_status import queue_status

_metrics_bearer = HTTPBearer(auto_error=False, scheme_name="MetricsToken")


async def require_metrics_token(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_metrics_bearer)],
) -> None:
    expected = settings.metrics_token
    if expected is None:
        return
    given = credentials.credentials if credentials is not None else ""
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise NotAuthenticated("not_authenticated", "metrics token required", bearer=True)


router = APIRouter(tags=["health"])


@router.get(
    "/metrics",
    response_class=Response,
    dependencies=[Depends(require_metrics_token)],
    responses={401: error("OASST_SERVER_METRICS_TOKEN is set and the request does not carry it")},
)
async def prometheus_metrics(sessions: SessionFactoryDep, broker: BrokerDep) -> Response:
    """Prometheus metrics: workers, queue depth and age, per-user backlog and service, in-flight per
    worker, latency and speed histograms."""
    status = await queue_status(sessions, broker)
    body, content_type = metrics.render(status)
    return Response(body, media_type=content_type)
