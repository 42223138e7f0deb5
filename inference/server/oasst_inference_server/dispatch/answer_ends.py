"""An answer's end stored in one SQL statement on the driver path (:mod:`..db.driver`), on Postgres.

Every answer ends with this statement, so it skips the ORM's CPU (docs/performance.md section 7c). It
means exactly what :meth:`.message_lifecycle.MessageLifecycle.complete`'s ORM statement means:
the message ends if it is still active, the session's and holds no continued answer's start; a cancel
asked meanwhile still wins (the statement reads ``cancel_requested`` itself); the row comes back as
stored. The columns it sets are those of the result's values (``_result_values``), so the two paths
cannot drift apart.

The connections are a pool of their own where main gives one (``database_answer_connections``): when
thousands of answers end within seconds, their ends wait for these, not for the connections of the
requests and readers, and the requests do not wait for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

from oasst_inference_server.db.driver import DriverConnections, message_from_row, stored_json
from oasst_inference_server.db.models import DbMessage, utcnow
from oasst_shared.schemas import MessageState

_JSON_VALUES = frozenset({"result_payload", "request_payload", "sampling_parameters", "scheduling"})
_ACTIVE = ", ".join(f"'{state.value}'" for state in (MessageState.pending, MessageState.in_progress))


@cache
def end_statement(columns: tuple[str, ...]) -> str:
    """The UPDATE that ends an answer with ``columns`` set to ``$5``... (``$1`` the message, ``$2`` the
    session, ``$3`` true if the worker says it was cancelled, ``$4`` the end's time). The column names
    are the code's own, never a caller's."""
    sets = ", ".join(
        f"{name} = ${number}" + ("::json" if name in _JSON_VALUES else "")
        for number, name in enumerate(columns, start=5)
    )
    return (
        "UPDATE message SET "
        f"state = CASE WHEN $3 OR cancel_requested THEN '{MessageState.cancelled.value}' "
        f"ELSE '{MessageState.complete.value}' END, "
        f"finished_at = $4, lease_deadline = NULL, {sets} "
        f"WHERE id = $1 AND worker_session_id = $2 AND state IN ({_ACTIVE}) AND answer_prefix IS NULL "
        "RETURNING *"
    )


async def end_answer(
    driver: DriverConnections,
    message_id: str,
    session_id: str,
    *,
    cancelled: bool,
    values: Mapping[str, object],
) -> DbMessage | None:
    """End the answer with ``values``; the message as stored, or None if it was not ended here (not
    active, another session's, or holding a continued answer's start: the ORM path reads it first)."""
    columns = tuple(values)
    arguments = [stored_json(values[name]) if name in _JSON_VALUES else values[name] for name in columns]
    async with driver.connection() as connection:
        row = await connection.fetchrow(
            end_statement(columns), message_id, session_id, cancelled, utcnow(), *arguments
        )
    return None if row is None else message_from_row(row)
