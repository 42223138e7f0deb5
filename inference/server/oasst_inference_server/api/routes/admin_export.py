"""The admin API's dataset export (``settings.admin_root_token``, as the rest of ``/admin``): the chats
that allow data use as Open-Assistant message trees, streamed as JSON lines."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import StreamingResponse

from oasst_inference_server.api.deps import SessionFactoryDep
from oasst_inference_server.api.moments import Moment
from oasst_inference_server.api.responses import ADMIN, error
from oasst_inference_server.api.routes.admin import require_admin
from oasst_inference_server.chats.export import ExportSelection, export_lines

NDJSON = "application/x-ndjson"

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(require_admin)], responses=ADMIN)


@router.get(
    "/export",
    response_class=StreamingResponse,
    responses={
        200: {"content": {NDJSON: {}}, "description": "One message tree (`ExportMessageTree`) per line"},
        422: error("since is not before until (`invalid_window`), or a malformed parameter"),
    },
)
async def export(
    sessions: SessionFactoryDep,
    since: Annotated[
        Moment | None, Query(description="Chats created at or after (UTC without a zone)")
    ] = None,
    until: Annotated[Moment | None, Query(description="Chats created before (UTC without a zone)")] = None,
    include_deleted: Annotated[bool, Query(description="Also the chats deleted accounts kept")] = False,
    user_id: Annotated[str | None, Query(max_length=36, description="Only this user's chats")] = None,
) -> StreamingResponse:
    """The chats that allow data use, with their votes, reports and evaluations, in the Open-Assistant
    export format: one message tree per line, streamed as it is read (a bounded batch of chats at a
    time). A stream that breaks off ends without its final chunk: read to the end or start again."""
    selection = ExportSelection(since=since, until=until, include_deleted=include_deleted, user_id=user_id)
    return StreamingResponse(
        export_lines(sessions, selection),
        media_type=NDJSON,
        headers={"Content-Disposition": 'attachment; filename="oasst-export.jsonl"'},
    )
