"""A terminal chat client for the inference server: an interactive REPL and a pipe mode."""

from oasst_text_client._exceptions import (
    ApiError,
    GenerationFailed,
    ModelUnavailable,
    ProtocolError,
    ServerUnreachable,
    StreamInterrupted,
    TextClientError,
    UsageError,
)
from oasst_text_client.api import ChatApiClient
from oasst_text_client.session import AnswerSink, ChatSession

__all__ = [
    "AnswerSink",
    "ApiError",
    "ChatApiClient",
    "ChatSession",
    "GenerationFailed",
    "ModelUnavailable",
    "ProtocolError",
    "ServerUnreachable",
    "StreamInterrupted",
    "TextClientError",
    "UsageError",
]
