"""Answers' ends stored in SQL of their own on the driver path (:mod:`..db.driver`), on Postgres, batched.

Every answer ends with this statement, so it skips the ORM's CPU (docs/performance.md section 7c). It
means exactly what :meth:`.message_lifecycle.MessageLifecycle.complete`'s ORM statement means: the
message ends if it is still active, the session's and holds no continued answer's start; a cancel asked
meanwhile still wins (the statement reads ``cancel_requested`` itself); the row comes back as stored.

**Batched.** When thousands of answers end within seconds (``bench.many_streams``' release), a statement
each made the ends wait for connections: under a busy event loop a statement's time is the loop's
latency more than the database's, so a few connections ended some 80 answers a second, and a worker whose
results queued that long lost its leases. So the ends asked while a statement runs wait for the next one,
which ends them all (``unnest`` of one array per column): with nothing else waiting an end runs at once,
under a burst a statement ends hundreds. At most ``connections`` statements run at once (the pool of
their own main gives them, ``database_answer_connections``), and a message is never twice in one
statement (a second end of it waits for the next, which finds it ended).

Failure semantics are those of a statement per end: a statement that fails raises in every end it
carried (the caller waits out a storage outage and asks again), and an asker that stops waiting does
not stop the statement.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from oasst_inference_server.db.driver import DriverConnections, message_from_row, stored_json
from oasst_inference_server.db.models import DbMessage, utcnow
from oasst_shared.schemas import MessageState

# The columns an end may set (``_result_values``' keys, ``answer_prefix`` aside: always cleared), with
# their array types. ``result_payload`` is left as it is where an end has none (NULL in its array).
_COLUMNS: dict[str, str] = {
    "content": "text",
    "finish_reason": "text",
    "generated_tokens": "int",
    "prompt_tokens": "int",
    "cached_tokens": "int",
    "result_payload": "text",
}
_ACTIVE = ", ".join(f"'{state.value}'" for state in (MessageState.pending, MessageState.in_progress))
# Ends per statement: far inside Postgres' limits, and a burst's worth.
MAX_BATCH = 500

_arrays = ", ".join(f"${number}::{kind}[]" for number, kind in enumerate(_COLUMNS.values(), start=5))
END_ANSWERS = (
    "UPDATE message AS m SET "
    f"state = CASE WHEN v.cancelled OR m.cancel_requested THEN '{MessageState.cancelled.value}' "
    f"ELSE '{MessageState.complete.value}' END, "
    "finished_at = $1, lease_deadline = NULL, answer_prefix = NULL, "
    + ", ".join(
        "result_payload = COALESCE(v.result_payload::json, m.result_payload)"
        if name == "result_payload"
        else f"{name} = v.{name}"
        for name in _COLUMNS
    )
    + f" FROM unnest($2::text[], $3::text[], $4::bool[], {_arrays}) "
    f"AS v(id, session_id, cancelled, {', '.join(_COLUMNS)}) "
    f"WHERE m.id = v.id AND m.worker_session_id = v.session_id AND m.state IN ({_ACTIVE}) "
    "AND m.answer_prefix IS NULL "
    "RETURNING m.*"
)


@dataclass
class _End:
    message_id: str
    session_id: str
    cancelled: bool
    values: Mapping[str, object]
    done: asyncio.Future[DbMessage | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class AnswerEnds:
    def __init__(self, driver: DriverConnections, connections: int) -> None:
        self._driver = driver
        self._limit = connections
        self._waiting: list[_End] = []
        self._running: set[asyncio.Task[None]] = set()
        self.statements = 0  # statements run (for tests and the logs)

    async def end(
        self, message_id: str, session_id: str, *, cancelled: bool, values: Mapping[str, object]
    ) -> DbMessage | None:
        """End the answer with ``values`` (``_result_values``); the message as stored, or None if it was
        not ended here (not active, another session's, or holding a continued answer's start: the ORM
        path reads it first)."""
        unknown = set(values) - set(_COLUMNS) - {"answer_prefix"}
        assert not unknown and values.get("answer_prefix") is None, unknown
        asked = _End(message_id, session_id, cancelled, values)
        self._waiting.append(asked)
        self._start_batches()
        # Shielded: an asker that leaves does not cancel the statement of the others.
        return await asyncio.shield(asked.done)

    async def close(self) -> None:
        for task in list(self._running):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    def _start_batches(self) -> None:
        while self._waiting and len(self._running) < self._limit:
            batch = self._take_batch()
            task = asyncio.create_task(self._run(batch), name="answer ends")
            self._running.add(task)
            task.add_done_callback(self._batch_done)

    def _take_batch(self) -> list[_End]:
        """Up to ``MAX_BATCH`` waiting ends, oldest first, no message twice (a second end of one waits)."""
        batch: list[_End] = []
        ids: set[str] = set()
        rest: list[_End] = []
        for asked in self._waiting:
            if len(batch) < MAX_BATCH and asked.message_id not in ids:
                ids.add(asked.message_id)
                batch.append(asked)
            else:
                rest.append(asked)
        self._waiting = rest
        return batch

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._start_batches()

    async def _run(self, batch: list[_End]) -> None:
        try:
            arguments: list[Any] = [
                utcnow(),
                [asked.message_id for asked in batch],
                [asked.session_id for asked in batch],
                [asked.cancelled for asked in batch],
            ]
            for name in _COLUMNS:
                column = [asked.values.get(name) for asked in batch]
                arguments.append([stored_json(v) for v in column] if name == "result_payload" else column)
            self.statements += 1
            async with self._driver.connection() as connection:
                rows = await connection.fetch(END_ANSWERS, *arguments)
        except BaseException as exc:
            for asked in batch:
                if not asked.done.done():
                    asked.done.set_exception(exc if isinstance(exc, Exception) else RuntimeError("stopped"))
                    asked.done.exception()  # seen: its asker may have left
            if not isinstance(exc, Exception):
                raise
            return
        ended = {row["id"]: message_from_row(row) for row in rows}
        for asked in batch:
            if not asked.done.done():
                asked.done.set_result(ended.get(asked.message_id))
