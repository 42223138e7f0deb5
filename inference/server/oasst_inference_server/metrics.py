"""Prometheus metrics of the server (``GET /metrics``).

Counters and histograms are updated where things happen; the queue gauges are computed from the
database at scrape time, so they show the truth on every replica.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from sqlalchemy import func
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.db.models import DbMessage, utcnow
from oasst_shared.schemas import MessageState

REGISTRY = CollectorRegistry(auto_describe=True)

WORKERS_CONNECTED = Gauge(
    "oasst_server_workers_connected", "Worker connections on this replica", ["model"], registry=REGISTRY
)
IN_FLIGHT = Gauge(
    "oasst_server_in_flight_generations", "Messages being generated", ["model"], registry=REGISTRY
)
QUEUE_DEPTH = Gauge(
    "oasst_server_queue_depth", "Pending messages (from the database)", ["model"], registry=REGISTRY
)
QUEUE_OLDEST_WAIT = Gauge(
    "oasst_server_queue_oldest_wait_seconds",
    "Age of the oldest pending message",
    ["model"],
    registry=REGISTRY,
)
DISPATCHED = Counter(
    "oasst_server_dispatched_total", "Messages handed to workers", ["model"], registry=REGISTRY
)
COMPLETED = Counter(
    "oasst_server_messages_finished_total",
    "Messages that ended, by state",
    ["model", "state"],
    registry=REGISTRY,
)
RETRIES = Counter(
    "oasst_server_retries_total", "Messages sent back to the queue", ["model"], registry=REGISTRY
)
CANCELS = Counter("oasst_server_cancels_total", "Cancel requests", registry=REGISTRY)
ERRORS = Counter("oasst_server_errors_total", "Errors by kind", ["kind"], registry=REGISTRY)
TOKENS = Counter(
    "oasst_server_tokens_relayed_total", "Tokens relayed to readers", ["model"], registry=REGISTRY
)
TIME_TO_FIRST_TOKEN = Histogram(
    "oasst_server_time_to_first_token_seconds",
    "From dispatch to a worker to its first token",
    ["model"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
TOKENS_PER_SECOND = Histogram(
    "oasst_server_tokens_per_second",
    "Decode speed of finished messages, first token to last",
    ["model"],
    buckets=(1, 5, 10, 25, 50, 100, 200, 500, 1000, 5000),
    registry=REGISTRY,
)


async def render(session_factory: async_sessionmaker[AsyncSession]) -> tuple[bytes, str]:
    """Refresh the database-derived gauges and return the exposition text."""
    async with session_factory() as session:
        rows = (
            await session.exec(
                select(DbMessage.model_config_name, func.count(), func.min(DbMessage.enqueued_at))
                .where(DbMessage.state == MessageState.pending.value)
                .group_by(DbMessage.model_config_name)
            )
        ).all()
    now = utcnow()
    QUEUE_DEPTH.clear()
    QUEUE_OLDEST_WAIT.clear()
    for model, count, oldest in rows:
        QUEUE_DEPTH.labels(model or "").set(count)
        if oldest is not None:  # the UTCDateTime column type returns aware datetimes
            QUEUE_OLDEST_WAIT.labels(model or "").set(max(0.0, (now - oldest).total_seconds()))
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
