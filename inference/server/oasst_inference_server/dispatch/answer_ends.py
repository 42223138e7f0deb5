"""Answers' ends stored in SQL of their own on the driver path (:mod:`..db.driver`), on Postgres, batched.

Every answer ends with this statement, so it skips the ORM's CPU (docs/performance.md section 7c). It
means exactly what :meth:`.message_lifecycle.MessageLifecycle.complete`'s ORM statement means: the
message ends if it is still active, the session's and holds no continued answer's start; a cancel asked
meanwhile still wins (the statement reads ``cancel_requested`` itself); the row comes back as stored.

**Batched** (:mod:`..db.batched`). When thousands of answers end within seconds (``bench.many_streams``'
release), a statement each ended some 80 answers a second under the busy event loop, and a worker whose
results queued that long lost its leases. So the ends asked while a statement runs share the next one
(``unnest`` of one array per column): with nothing else waiting an end runs at once, under a burst a
statement ends hundreds. At most ``connections`` statements run at once (the pool of their own main gives
them, ``database_answer_connections``), and a message is never twice in one statement (a second end of it
waits for the next, which finds it ended). A statement that fails raises in every end it carried (the
caller waits out a storage outage and asks again).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from oasst_inference_server.db.batched import Batched
from oasst_inference_server.db.driver import DriverConnections, message_from_row, sql_values, stored_json
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
_ACTIVE = sql_values((MessageState.pending, MessageState.in_progress))
# Ends per statement: far inside Postgres' limits, and a burst's worth.
MAX_BATCH = 500

_arrays = ", ".join(f"${number}::{kind}[]" for number, kind in enumerate(_COLUMNS.values(), start=5))
END_ANSWERS = (
    # The rows it ends, locked first in the order of their ids, as every statement that changes several
    # messages locks them (``lease_extensions`` too): two such statements never wait for each other
    # crosswise (a deadlock, which failed ends at the burst of bench.many_streams).
    "WITH locked AS MATERIALIZED (SELECT id FROM message WHERE id = ANY($2::text[]) ORDER BY id FOR UPDATE) "
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
    + f" FROM locked, unnest($2::text[], $3::text[], $4::bool[], {_arrays}) "
    f"AS v(id, session_id, cancelled, {', '.join(_COLUMNS)}) "
    "WHERE m.id = locked.id AND m.id = v.id AND m.worker_session_id = v.session_id "
    f"AND m.state IN ({_ACTIVE}) AND m.answer_prefix IS NULL "
    "RETURNING m.*"
)


@dataclass(frozen=True)
class _End:
    message_id: str
    session_id: str
    cancelled: bool
    values: Mapping[str, object]


def _size(asked: _End) -> int:
    """About what an end adds to its statement: its text (a worker frame's at most, 1 MiB)."""
    return len(str(asked.values.get("content") or "")) + len(str(asked.values.get("result_payload") or ""))


class AnswerEnds:
    def __init__(self, driver: DriverConnections, connections: int) -> None:
        self._driver = driver
        self._batched: Batched[_End, DbMessage | None] = Batched(
            self._end_all,
            limit=connections,
            max_batch=MAX_BATCH,
            key=lambda asked: asked.message_id,
            size=_size,
            name="answer ends",
        )

    @property
    def statements(self) -> int:
        return self._batched.statements

    async def end(
        self, message_id: str, session_id: str, *, cancelled: bool, values: Mapping[str, object]
    ) -> DbMessage | None:
        """End the answer with ``values`` (``_result_values``); the message as stored, or None if it was
        not ended here (not active, another session's, or holding a continued answer's start: the ORM
        path reads it first)."""
        unknown = set(values) - set(_COLUMNS) - {"answer_prefix"}
        assert not unknown and values.get("answer_prefix") is None, unknown
        return await self._batched.ask(_End(message_id, session_id, cancelled, values))

    async def close(self) -> None:
        await self._batched.close()

    async def _end_all(self, batch: list[_End]) -> list[DbMessage | None]:
        ids = [asked.message_id for asked in batch]
        arguments: list[Any] = [utcnow(), ids, [a.session_id for a in batch], [a.cancelled for a in batch]]
        for name in _COLUMNS:
            column = [asked.values.get(name) for asked in batch]
            arguments.append([stored_json(v) for v in column] if name == "result_payload" else column)
        async with self._driver.connection() as connection:
            rows = await connection.fetch(END_ANSWERS, *arguments)
        ended = {row["id"]: message_from_row(row) for row in rows}
        return [ended.get(message_id) for message_id in ids]
