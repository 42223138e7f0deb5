from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from oasst_inference_server import metrics
from oasst_inference_server.dispatch.queue_status import queue_status

router = APIRouter(tags=["health"])


@router.get("/metrics", response_class=Response)
async def prometheus_metrics(request: Request) -> Response:
    """Prometheus metrics: workers, queue depth and age, per-user backlog and service, in-flight per
    worker, latency and speed histograms."""
    status = await queue_status(request.app.state.session_factory, request.app.state.broker)
    body, content_type = metrics.render(status)
    return Response(body, media_type=content_type)
