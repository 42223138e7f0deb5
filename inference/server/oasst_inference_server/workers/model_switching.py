"""A worker's model switches (protocol 6), on the replica that holds its socket.

A switch starts with a command from any replica (``fleet.switcher``, on the session's command channel):
:meth:`ModelSwitching.begin_switch` checks it against the connection's state, takes the worker out of
dispatch (``capacity.available`` is false from this moment: no new job, no hand-over), puts the jobs
assigned to it but not yet claimed back in the queue, waits (bounded) for a claim under way to send its
job, and sends ``load_model`` or ``unload_model``. The worker's in-flight jobs finish as usual while it
drains.

Then the worker reports ``model_switch`` steps, kept as the session's progress (the last one; the session
record is republished when the step changes and at most once a second otherwise), and ends with a new
``worker_info``, which is accepted only now, only from the worker told to switch, and only naming the model
asked for or the one it had (after a failed load it serves its previous model; after an unload it names
the model it last served, with ``loaded`` false). Anything else closes the socket with 1008 (a worker that
announces more slots than its key allows: 4003). The session then serves the new model as if it had just
connected with it: its dispatcher, capacity, capabilities, compliance identity and session record.

A switch that does not end within ``model_switch_timeout`` closes the socket. Metrics: switches by model and
outcome, their duration, workers switching now.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from typing import cast

from loguru import logger
from starlette.websockets import WebSocketDisconnect

from oasst_inference_server import metrics
from oasst_inference_server.broker.worker_session import (
    MAX_REASON_CHARS,
    MAX_SWITCH_ERROR_CHARS,
    SwitchOutcome,
    SwitchState,
)
from oasst_inference_server.fleet.commands import REFUSALS, SwitchCommand, SwitchReply
from oasst_inference_server.scheduling.capacity import WorkerCapacity
from oasst_inference_server.scheduling.dispatcher import Assignable, ModelDispatcher
from oasst_inference_server.workers.connection_core import ConnectionClosed, ConnectionCore, Switch
from oasst_shared.protocol import (
    CLOSE_GOING_AWAY,
    CLOSE_KEY_FORBIDS,
    CLOSE_POLICY_VIOLATION,
    LoadModel,
    ModelSwitch,
    UnloadModel,
    WorkerInfo,
)

# The most model_switch frames one switch may send (a quantizer's progress is a frame per tensor at most).
MAX_SWITCH_FRAMES = 100_000
# Progress (not a new step) is republished at most this often (seconds).
_PROGRESS_PUBLISH_INTERVAL = 1.0
_REASON_LABEL = re.compile(r"[a-z][a-z0-9_]{0,31}")


def reason_label(reason: str) -> str:
    """The metrics' label of a switch's reason: its first word (``on_demand``, ``keep_alive``, ``admin``,
    ``rebalance``...), or ``other``."""
    word = re.split(r"[\s:(]", reason.strip().lower(), maxsplit=1)[0]
    return word if _REASON_LABEL.fullmatch(word) else "other"


class ModelSwitching(ConnectionCore):
    model_name: str
    _dispatcher: ModelDispatcher | None

    # ------------------------------------------------------------ the command
    async def begin_switch(self, command: SwitchCommand) -> SwitchReply:
        """Start the switch ``command`` asks for, or say why not (nothing changes then)."""
        refusal = self._switch_refusal(command)
        if refusal is not None:
            code, detail = refusal
            logger.info("worker {}: {} refused: {}", self.session_id, command.action, detail)
            return SwitchReply(request_id=command.request_id, accepted=False, code=code, detail=detail)
        state = SwitchState(
            request_id=command.request_id,
            action=command.action,
            model_config_name=command.model_config_name if command.action == "load" else None,
            from_model=self.model_name,
            reason=command.reason[:MAX_REASON_CHARS],
            started_at=time.time(),
        )
        self.switch = Switch(state)
        metrics.MODELS_SWITCHING.inc()
        metrics.MODEL_SWITCHES_REQUESTED.labels(
            state.model_config_name or self.model_name, reason_label(command.reason)
        ).inc()
        self._capacity_changed()
        await self._take_back_assigned()
        await self._publish_session()
        await self._wait_for_claims()
        frame = (
            LoadModel(request_id=command.request_id, model_config_name=state.model_config_name or "")
            if command.action == "load"
            else UnloadModel(request_id=command.request_id)
        )
        try:
            await self._send(frame)
        except (ConnectionClosed, RuntimeError, WebSocketDisconnect) as exc:
            if self._broken is not None and not self._broken.done():
                closed = exc if isinstance(exc, ConnectionClosed) else None
                self._broken.set_result(closed or ConnectionClosed(CLOSE_GOING_AWAY, "socket closed"))
            return SwitchReply(
                request_id=command.request_id,
                accepted=False,
                code="worker_gone",
                detail=REFUSALS["worker_gone"],
            )
        logger.info(
            "worker {}: {} {} ({}), {} in flight to drain",
            self.session_id,
            command.action,
            state.model_config_name or self.model_name,
            state.reason or "no reason given",
            len(self._held),
        )
        return SwitchReply(request_id=command.request_id, accepted=True)

    def _switch_refusal(self, command: SwitchCommand) -> tuple[str, str] | None:
        def refused(code: str, detail: str | None = None) -> tuple[str, str]:
            return code, detail or REFUSALS[code]

        if not self.switchable:
            return refused("worker_cannot_switch")
        if self.switch is not None:
            return refused("worker_switching")
        if self.draining:
            return refused("worker_draining")
        if command.only_if_idle and self.capacity.in_flight:
            return refused("worker_busy")
        if command.action == "unload":
            return None if self.loaded else refused("already_unloaded")
        model = command.model_config_name or ""
        if model not in self.servable:
            names = ", ".join(self.servable)
            return refused(
                "model_not_servable", f"the worker cannot load {model!r}; it can load: {names}"[:1000]
            )
        if self.loaded and model == self.model_name:
            return refused("already_loaded")
        return None

    async def _take_back_assigned(self) -> None:
        """Jobs assigned to this worker but not claimed yet go back to the queue (their users' places kept)."""
        while not self._assigned.empty():
            message_id, _ = self._assigned.get_nowait()
            self._count_slot(-1)
            with contextlib.suppress(Exception):
                await self._lifecycle.requeue(message_id)
        self._capacity_changed()

    async def _wait_for_claims(self) -> None:
        """Let a claim or hand-over under way send its job before the switch's frame (the worker takes no
        job after it); bounded: a stuck one is sent after it, and the worker hands it back."""
        deadline = time.monotonic() + self._settings.worker_send_timeout
        while self._claiming > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    # ------------------------------------------------------------ the worker's frames
    async def _on_model_switch(self, frame: ModelSwitch) -> None:
        switch = self.switch
        if switch is None or frame.request_id != switch.state.request_id:
            raise ConnectionClosed(
                CLOSE_POLICY_VIOLATION, "model_switch without a load_model or unload_model it answers"
            )
        expected = switch.state.model_config_name or switch.state.from_model
        if frame.model_config_name != expected:
            raise ConnectionClosed(
                CLOSE_POLICY_VIOLATION,
                f"model_switch names {frame.model_config_name!r}; the switch is of {expected!r}"[:120],
            )
        switch.frames += 1
        if switch.frames > MAX_SWITCH_FRAMES:
            raise ConnectionClosed(
                CLOSE_POLICY_VIOLATION, f"more than {MAX_SWITCH_FRAMES} model_switch frames"
            )
        state = switch.state
        new_step = frame.step != state.step
        state.step = frame.step
        state.tensors_done, state.tensors_total = frame.tensors_done, frame.tensors_total
        state.error = frame.error[:MAX_SWITCH_ERROR_CHARS] if frame.error else None
        now = time.monotonic()
        if new_step:
            logger.info(
                "worker {}: {} {}: {}{}",
                self.session_id,
                state.action,
                expected,
                frame.step,
                f" ({state.error})" if state.error else "",
            )
        elif now - switch.published_at < _PROGRESS_PUBLISH_INTERVAL:
            return
        switch.published_at = now
        await self._publish_session()

    async def _on_worker_info(self, info: WorkerInfo) -> None:
        switch = self.switch
        if switch is None:
            raise ConnectionClosed(
                CLOSE_POLICY_VIOLATION,
                "worker_info may only be the first frame, or end a switch the server asked for",
            )
        state = switch.state
        name = info.model_config_.name
        allowed = {state.from_model} | ({state.model_config_name} if state.model_config_name else set())
        if name not in allowed:
            asked = f"load {state.model_config_name!r}" if state.action == "load" else "unload"
            raise ConnectionClosed(
                CLOSE_POLICY_VIOLATION,
                f"worker_info names {name!r}; it was told to {asked} (from {state.from_model!r})"[:120],
            )
        refusal = self._key_limits.slots_refusal(info)
        if refusal is not None:
            raise ConnectionClosed(CLOSE_KEY_FORBIDS, refusal[:120])
        if state.action == "load":
            outcome = "ready" if info.loaded and name == state.model_config_name else "failed"
        else:
            outcome = "unloaded" if not info.loaded else "failed"
        await self._serve(info)
        seconds = time.monotonic() - switch.started
        self.last_switch = SwitchOutcome(
            action=state.action,
            model_config_name=state.model_config_name,
            outcome=outcome,
            seconds=round(seconds, 3),
            finished_at=time.time(),
            error=state.error if outcome == "failed" else None,
        )
        self._switch_ended(outcome)
        logger.info(
            "worker {}: {} {} in {:.1f}s: serves {}{}",
            self.session_id,
            state.action,
            outcome,
            seconds,
            name,
            "" if info.loaded else " (unloaded)",
        )
        self._capacity_changed()
        self._broker.session_changed_here()
        await self._publish_session()

    def _switch_ended(self, outcome: str) -> None:
        """Count the switch under way as ended with ``outcome`` (ready, failed, unloaded, lost, timeout)."""
        switch, self.switch = self.switch, None
        if switch is None:
            return
        metrics.MODELS_SWITCHING.dec()
        model = switch.state.model_config_name or switch.state.from_model
        metrics.MODEL_SWITCHES.labels(model, outcome).inc()
        metrics.MODEL_SWITCH_SECONDS.labels(model).observe(time.monotonic() - switch.started)

    def _check_switch_deadline(self) -> None:
        switch = self.switch
        timeout = self._settings.model_switch_timeout
        if switch is not None and time.monotonic() - switch.started > timeout:
            self._switch_ended("timeout")
            raise ConnectionClosed(CLOSE_GOING_AWAY, f"the model switch did not end within {timeout:.0f}s")

    # ------------------------------------------------------------ serving what the worker announced
    async def _serve(self, info: WorkerInfo) -> None:
        """Serve as the new ``info`` says, as a worker that had just connected with it would."""
        old_model, old_label, old_dispatcher = self.model_name, self.metric_model, self._dispatcher
        self.info = info
        self.servable = self._key_limits.servable(info, self.protocol_version)
        self.loaded = info.loaded
        name = info.model_config_.name
        self.model_name = name
        if self.metric_model != old_label:
            metrics.WORKERS_CONNECTED.labels(old_label).dec()
            metrics.WORKERS_CONNECTED.labels(self.metric_model).inc()
        if name != old_model:
            if self._held:  # the worker lied about draining: its jobs finish, counted under the new name
                metrics.IN_FLIGHT.labels(old_model).dec(len(self._held))
                metrics.IN_FLIGHT.labels(name).inc(len(self._held))
            # Another model: what was measured of the old one (speeds, KV cache) says nothing of it.
            self.capacity = WorkerCapacity(self.session_id, declared_slots=info.max_parallel_requests)
            self._tokens_relayed = metrics.TOKENS.labels(name)
            self._compliance.switched(name)
        else:
            self.capacity.declared_slots = info.max_parallel_requests
        dispatcher = old_dispatcher if old_dispatcher is not None and name == old_model else None
        if self.loaded and dispatcher is None:
            if self._dispatchers is None:
                logger.error("worker {}: no dispatchers to serve {} with", self.session_id, name)
            else:
                dispatcher = self._dispatchers.for_model(name)
        if not self.loaded:
            dispatcher = None
        if dispatcher is not old_dispatcher:
            me = cast(Assignable, self)  # a WorkerConnection: its job sending is the dispatcher's side
            if old_dispatcher is not None:
                with contextlib.suppress(Exception):
                    await old_dispatcher.detach(me)
            self._dispatcher = dispatcher
            if dispatcher is not None:
                dispatcher.attach(me)
        elif dispatcher is not None:
            dispatcher.workers_changed()  # the same model anew: what it can do (counting) may differ
