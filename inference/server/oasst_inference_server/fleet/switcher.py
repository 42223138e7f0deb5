"""Telling one worker socket, on whichever replica holds it, to load or unload a model.

    switcher = ModelSwitcher(broker, sessions, settings)
    await switcher.load(session_id, "SmolLM2-135M-Instruct-Q8_0", reason="on_demand")
    await switcher.unload(session_id, reason="keep_alive", only_if_idle=True)

Each call reads the worker's session afresh, publishes a :class:`.commands.SwitchCommand` on the session's
command channel (where cancels travel) and waits for the holding replica's answer: it returns once that
replica has sent ``load_model`` / ``unload_model`` to the worker. The switch itself (drain, unload,
quantize, load) goes on after that; its progress and outcome are in the session record (``switch``,
``last_switch``: ``GET /admin/fleet``).

Errors (domain errors, so the admin API maps them to HTTP as they are):

* ``NotFound`` ``unknown_worker_session``: no live session has that id;
* :class:`SwitchRefused` (a ``Conflict``): the worker cannot do it now, ``code`` one of
  :data:`.commands.REFUSALS` (``model_not_servable``, ``worker_switching``, ``already_loaded``...);
* ``ServiceUnavailable`` ``switch_unanswered``: the holding replica did not answer in
  ``model_switch_reply_timeout`` (it is gone, or the broker is down); nothing is known to have been sent.
"""

from __future__ import annotations

import uuid
from typing import Literal

from loguru import logger
from pydantic import ValidationError

from oasst_inference_server.broker import Broker, BrokerError, WorkerSession
from oasst_inference_server.broker.reply_channel import ReplyChannel, ReplyTimeout
from oasst_inference_server.broker.session_view import WorkerSessionView
from oasst_inference_server.broker.worker_session import MAX_REASON_CHARS
from oasst_inference_server.domain_errors import Conflict, NotFound, ServiceUnavailable
from oasst_inference_server.events import worker_command_channel
from oasst_inference_server.fleet.commands import REFUSALS, SwitchCommand, SwitchReply
from oasst_inference_server.settings import Settings


class SwitchRefused(Conflict):
    """The worker cannot make this switch now; ``code`` is a key of :data:`.commands.REFUSALS`."""


class ModelSwitcher:
    def __init__(
        self,
        broker: Broker,
        sessions: WorkerSessionView,
        settings: Settings,
        replies: ReplyChannel[SwitchReply] | None = None,
    ) -> None:
        self._broker = broker
        self._sessions = sessions
        self._settings = settings
        self._replies = replies or ReplyChannel(broker, "switch-replies", _switch_reply)

    async def load(self, session_id: str, model_config_name: str, reason: str) -> None:
        """Have the worker of ``session_id`` serve ``model_config_name`` (one it lists as servable)."""
        await self._command(session_id, "load", model_config_name, reason, only_if_idle=False)

    async def unload(self, session_id: str, reason: str, *, only_if_idle: bool = False) -> None:
        """Have the worker of ``session_id`` unload its model (it serves nothing until a load);
        ``only_if_idle``: refused (``worker_busy``) if it holds any work when the command arrives."""
        await self._command(session_id, "unload", None, reason, only_if_idle=only_if_idle)

    async def close(self) -> None:
        await self._replies.close()

    async def _command(
        self,
        session_id: str,
        action: Literal["load", "unload"],
        model: str | None,
        reason: str,
        *,
        only_if_idle: bool,
    ) -> None:
        session = await self._session(session_id)
        _precheck(session, action, model)
        command = SwitchCommand(
            request_id=f"sw-{uuid.uuid4().hex[:20]}",
            action=action,
            model_config_name=model,
            reason=reason[:MAX_REASON_CHARS],
            only_if_idle=only_if_idle,
            reply_to=self._replies.channel,
        )
        timeout = self._settings.model_switch_reply_timeout
        try:
            reply = await self._replies.request(
                worker_command_channel(session_id), command.request_id, command.dump(), timeout
            )
        except (ReplyTimeout, BrokerError) as exc:
            raise ServiceUnavailable(
                "switch_unanswered",
                f"the replica holding worker {session_id} did not answer the {action} command: {exc}",
            ) from None
        if not reply.accepted:
            code = reply.code or "worker_gone"
            raise SwitchRefused(code, reply.detail or REFUSALS.get(code, code))
        what = f"load {model}" if action == "load" else "unload"
        logger.info("{} sent to worker {} ({})", what, session_id, command.reason or "no reason given")

    async def _session(self, session_id: str) -> WorkerSession:
        try:
            sessions = (await self._sessions.snapshot(fresh=True)).sessions
        except BrokerError as exc:
            raise ServiceUnavailable(
                "broker_unavailable", f"the worker sessions cannot be read: {exc}"
            ) from None
        session = sessions.get(session_id)
        if session is None:
            raise NotFound("unknown_worker_session", f"no connected worker has the session id {session_id!r}")
        return session


def _precheck(session: WorkerSession, action: str, model: str | None) -> None:
    """What the record already tells (the holding replica checks everything again, with the truth)."""
    if not session.switchable:
        raise SwitchRefused("worker_cannot_switch", REFUSALS["worker_cannot_switch"])
    if action == "load" and (model is None or not session.can_load(model)):
        names = ", ".join(s.name for s in session.servable) or "none"
        raise SwitchRefused(
            "model_not_servable", f"the worker cannot load {model!r}; it can load: {names}"[:1000]
        )


def _switch_reply(data: str) -> tuple[str, SwitchReply] | None:
    try:
        reply = SwitchReply.model_validate_json(data)
    except ValidationError:
        return None
    return reply.request_id, reply
