"""A load or unload command for a worker socket, as the broker carries it to the replica holding that
socket (on the session's command channel, as a cancel travels), and that replica's answer (on the asking
process's reply channel, :mod:`.replies`).

The answer says only whether the command went out to the worker, or why not (a code of
:data:`REFUSALS`); how the switch goes, the worker's session record shows (``switch``, ``last_switch``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from oasst_inference_server.broker.worker_session import MAX_REASON_CHARS

_COMMAND_PREFIX = '{"type":"switch"'

# Why the replica holding a socket did not send a command: code -> what it means.
REFUSALS: dict[str, str] = {
    "worker_cannot_switch": "the worker speaks a protocol older than 6 or lists nothing it can switch to",
    "model_not_servable": "the worker does not list the model (or its key does not allow it)",
    "already_loaded": "the worker serves that model already",
    "already_unloaded": "the worker holds no model",
    "worker_switching": "the worker is making another switch",
    "worker_draining": "the worker is shutting down",
    "worker_busy": "the worker holds work (an unload only when idle)",
    "worker_gone": "the socket closed before the command went out",
}


class SwitchCommand(BaseModel):
    type: Literal["switch"] = "switch"
    request_id: str = Field(min_length=1, max_length=64, description="Also the frame's `request_id`.")
    action: Literal["load", "unload"]
    model_config_name: str | None = Field(None, max_length=256, description="The model to load.")
    reason: str = Field("", max_length=MAX_REASON_CHARS)
    only_if_idle: bool = Field(False, description="Refuse (`worker_busy`) if the worker holds any work.")
    reply_to: str = Field(max_length=128, description="The channel the asker reads answers on.")

    def dump(self) -> str:
        # The prefix :func:`is_switch_command` looks for: ``type`` first, no spaces.
        return self.model_dump_json()


class SwitchReply(BaseModel):
    type: Literal["switch_reply"] = "switch_reply"
    request_id: str
    accepted: bool
    code: str | None = Field(None, description="A key of REFUSALS when not accepted.")
    detail: str = ""


def is_switch_command(command: str) -> bool:
    return command.startswith(_COMMAND_PREFIX)
