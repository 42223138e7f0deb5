"""The OpenAI Responses API: ``/v1/responses`` (create), ``/v1/responses/{id}`` (retrieve, resume a
stream with ``stream=true&starting_after=N``, delete), ``/cancel`` and ``/input_items``.

Authenticate as for the rest of ``/v1``; errors have OpenAI's shape. Each route is one call into
:class:`~oasst_inference_server.responses_api.serving.ResponsesServing`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request, Response

from oasst_inference_server.api.deps import ApiCaller, ResponsesServingDep, SessionDep
from oasst_inference_server.api.served import respond
from oasst_inference_server.openai_protocol.errors import ErrorResponse
from oasst_inference_server.responses_api.wire import MAX_ITEM_ID, RESPONSE_ID_PREFIX, ResponsesRequest

router = APIRouter(prefix="/v1/responses", tags=["openai"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "Invalid or unsupported parameters"},
    401: {"model": ErrorResponse, "description": "Missing, invalid or revoked API key"},
    404: {"model": ErrorResponse, "description": "Unknown model, or no such response of the caller"},
    429: {
        "model": ErrorResponse,
        "description": "Rate limit, concurrency limit or open event streams (see Retry-After)",
    },
    503: {"model": ErrorResponse, "description": "No worker serves the model right now"},
}
_STREAM = {"content": {"text/event-stream": {}}, "description": "With stream=true: the typed events"}
ResponseId = Annotated[str, Path(max_length=MAX_ITEM_ID + len(RESPONSE_ID_PREFIX))]


@router.post("", responses={**_ERRORS, 200: _STREAM})
async def create_response(
    request: Request,
    response: Response,
    body: ResponsesRequest,
    caller: ApiCaller,
    session: SessionDep,
    serving: ResponsesServingDep,
) -> Any:
    """Answer the input; ``stream`` for the typed events, ``background`` to return at once (then poll,
    stream or cancel it by its id)."""
    return respond(await serving.create(session, caller, body, request.is_disconnected), response)


@router.get("/{response}", responses={**_ERRORS, 200: _STREAM})
async def retrieve_response(
    request: Request,
    reply: Response,
    response: ResponseId,
    caller: ApiCaller,
    serving: ResponsesServingDep,
    stream: bool = False,
    starting_after: Annotated[int | None, Query(ge=-1, le=2**31)] = None,
) -> Any:
    """The response as it is now; with ``stream=true`` its events (those after ``starting_after``),
    following it to the end (one of the caller's event-stream readers, as on the chat API)."""
    served = await serving.retrieve(
        caller,
        response,
        stream=stream,
        starting_after=starting_after,
        is_disconnected=request.is_disconnected,
    )
    return respond(served, reply)


@router.post("/{response}/cancel", responses=_ERRORS)
async def cancel_response(response: ResponseId, caller: ApiCaller, serving: ResponsesServingDep) -> Any:
    """Cancel a background response (queued or in progress)."""
    return await serving.cancel(caller, response)


@router.delete("/{response}", responses=_ERRORS)
async def delete_response(response: ResponseId, caller: ApiCaller, serving: ResponsesServingDep) -> Any:
    """Delete a stored response (stopping it if it still runs)."""
    return await serving.delete(caller, response)


@router.get("/{response}/input_items", responses=_ERRORS)
async def list_input_items(
    response: ResponseId,
    caller: ApiCaller,
    serving: ResponsesServingDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
    after: Annotated[str | None, Query(max_length=MAX_ITEM_ID * 2)] = None,
) -> Any:
    """The input items of the response (newest first unless ``order=asc``), ``limit`` at a time after
    the item ``after``."""
    return await serving.input_items(caller, response, limit=limit, order=order, after=after)
