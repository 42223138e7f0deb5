from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from oasst_inference_server import metrics

router = APIRouter(tags=["health"])


@router.get("/metrics", response_class=Response)
async def prometheus_metrics(request: Request) -> Response:
    """Prometheus metrics: workers, queue depth and age, in-flight, latency and speed histograms."""
    body, content_type = await metrics.render(request.app.state.session_factory)
    return Response(body, media_type=content_type)
