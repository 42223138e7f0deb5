"""What a message's readers and workers are sent, and where: the encoded server-sent events
(:mod:`.encoding`), the broker names of event streams, work queues and command channels (:mod:`.names`),
and a stored message as the API and its events carry it (:mod:`.message_read`).

May import db and oasst_shared; nothing else of the server.
"""

from __future__ import annotations

from oasst_inference_server.events.encoding import (
    continuation_event,
    error_event,
    gap_event,
    is_terminal,
    is_terminal_type,
    message_event,
    pending_event,
    plain_token_text,
    retry_event,
    token_event,
)
from oasst_inference_server.events.message_read import to_message_read
from oasst_inference_server.events.names import stream_name, work_queue_name, worker_command_channel

__all__ = [
    "continuation_event",
    "error_event",
    "gap_event",
    "is_terminal",
    "is_terminal_type",
    "message_event",
    "pending_event",
    "plain_token_text",
    "retry_event",
    "stream_name",
    "to_message_read",
    "token_event",
    "work_queue_name",
    "worker_command_channel",
]
