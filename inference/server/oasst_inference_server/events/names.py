"""The broker names of a message's event stream, a model's work queue and a worker session's command
channel."""

from __future__ import annotations


def stream_name(message_id: str) -> str:
    return f"events:{message_id}"


def work_queue_name(model_config_name: str) -> str:
    return f"work:{model_config_name}"


def worker_command_channel(session_id: str) -> str:
    return f"worker-commands:{session_id}"
