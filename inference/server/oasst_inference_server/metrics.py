"""Prometheus metrics of the server (``GET /metrics``).

Counters and histograms are updated where things happen; the queue gauges are computed at scrape
time from the database and the broker (``scheduling.queue_status``), so every replica shows the same.
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

from oasst_shared.schemas import QueueStatus

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
AFFINITY_DISPATCHES = Counter(
    "oasst_server_affinity_dispatches_total",
    "Follow-up turns dispatched to the worker of their previous turn (hit) or to another (miss)",
    ["model", "outcome"],
    registry=REGISTRY,
)
COMPLIANCE_CHECKS = Counter(
    "oasst_server_compliance_checks_total",
    "Compliance checks of untrusted workers, by kind (output, usage) and outcome",
    ["model", "kind", "outcome"],
    registry=REGISTRY,
)
WORKERS_FLAGGED = Counter(
    "oasst_server_workers_flagged_total",
    "Worker keys flagged for failing compliance checks",
    registry=REGISTRY,
)
CANCELS = Counter("oasst_server_cancels_total", "Cancel requests", registry=REGISTRY)
ERRORS = Counter("oasst_server_errors_total", "Errors by kind", ["kind"], registry=REGISTRY)
CONNECTIONS_REFUSED = Counter(
    "oasst_server_connections_refused_total",
    "Connections answered and closed before a request: over_cap, header_timeout, header_too_large",
    ["reason"],
    registry=REGISTRY,
)
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
MODEL_SWITCHES = Counter(
    "oasst_server_model_switches_total",
    "Model switches of workers of this replica, by the model asked for (or unloaded) and outcome: ready, "
    "failed (the worker serves its previous model), unloaded, lost (the socket ended), timeout",
    ["model", "outcome"],
    registry=REGISTRY,
)
MODEL_SWITCH_SECONDS = Histogram(
    "oasst_server_model_switch_seconds",
    "From a load_model or unload_model to the worker's new worker_info (drain, unload, quantize, load)",
    ["model"],
    buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600),
    registry=REGISTRY,
)
MODEL_SWITCHES_REQUESTED = Counter(
    "oasst_server_model_switches_requested_total",
    "Load and unload commands accepted by a worker's replica, by model and reason (on_demand, keep_alive, "
    "admin, the rebalancer's)",
    ["model", "reason"],
    registry=REGISTRY,
)
MODELS_SWITCHING = Gauge(
    "oasst_server_workers_switching",
    "Workers of this replica told to switch that have not sent their new worker_info yet",
    registry=REGISTRY,
)


QUEUE_TIMEOUTS = Counter(
    "oasst_server_queue_timeouts_total",
    "Messages failed for waiting past their queue timeout",
    ["model"],
    registry=REGISTRY,
)
USER_BACKLOG = Gauge(
    "oasst_server_user_backlog",
    "Messages a user has waiting in the fair queue (the top users)",
    ["model", "user"],
    registry=REGISTRY,
)
USER_SERVICE = Gauge(
    "oasst_server_user_tokens_served_window",
    "Prompt + generated tokens of a user's messages finished in the last window (the top users)",
    ["model", "user"],
    registry=REGISTRY,
)
WORKER_IN_FLIGHT = Gauge(
    "oasst_server_worker_in_flight",
    "Messages a worker session is generating",
    ["model", "session"],
    registry=REGISTRY,
)
WORKER_TOKENS_PER_SECOND = Gauge(
    "oasst_server_worker_tokens_per_second",
    "The decode speed the server measured on a worker session",
    ["model", "session"],
    registry=REGISTRY,
)


def render(status: QueueStatus) -> tuple[bytes, str]:
    """Set the queue gauges from ``status`` (``scheduling.queue_status``) and return the exposition text."""
    for gauge in (QUEUE_DEPTH, QUEUE_OLDEST_WAIT, USER_BACKLOG, USER_SERVICE, WORKER_IN_FLIGHT):
        gauge.clear()
    WORKER_TOKENS_PER_SECOND.clear()
    for model in status.models:
        name = model.model_config_name
        QUEUE_DEPTH.labels(name).set(model.depth)
        if model.oldest_wait_seconds is not None:
            QUEUE_OLDEST_WAIT.labels(name).set(model.oldest_wait_seconds)
        for backlog in model.backlog:
            USER_BACKLOG.labels(name, backlog.user_id).set(backlog.waiting)
        for service in model.service:
            USER_SERVICE.labels(name, service.user_id).set(service.tokens)
        for worker in model.workers:
            WORKER_IN_FLIGHT.labels(name, worker.session_id).set(worker.in_flight)
            if worker.tokens_per_second:
                WORKER_TOKENS_PER_SECOND.labels(name, worker.session_id).set(worker.tokens_per_second)
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


# The rebalancer (scheduling/rebalancer.py), on the replica that holds its lock.
REBALANCER_MOVES = Counter(
    "oasst_server_rebalancer_moves_total",
    "Workers the rebalancer told to switch, by the model they left and the one they load ('none': "
    "nothing), the rule (minimum, demand, maximum) and whether the switcher took the order",
    ["from_model", "to_model", "kind", "outcome"],
    registry=REGISTRY,
)
REBALANCER_DEMAND_SLOTS = Gauge(
    "oasst_server_rebalancer_demand_slots",
    "Slots a model's traffic and queue need, as the rebalancer's last round measured them",
    ["model"],
    registry=REGISTRY,
)
REBALANCER_CAPACITY_SLOTS = Gauge(
    "oasst_server_rebalancer_capacity_slots",
    "Slots of the workers serving a model (or switching to it) in the rebalancer's last round",
    ["model"],
    registry=REGISTRY,
)
