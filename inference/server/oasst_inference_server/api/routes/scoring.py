"""Rerank and score on embedding models: ``/v1/rerank`` (also ``/rerank``, ``/v2/rerank``: the Cohere and
Jina shape) and ``/v1/score`` (also ``/score``: vLLM's).

Each request is one ``/v1/embeddings`` job of its texts (same queue, limits and usage); the scores are the
cosine similarities of the vectors (:mod:`oasst_inference_server.openai_api.serving_scoring`). Errors have
OpenAI's shape on every path.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from oasst_inference_server.api.deps import ApiCaller, ScoringServingDep, SessionDep
from oasst_inference_server.api.served import respond
from oasst_inference_server.openai_protocol.errors import ErrorResponse
from oasst_inference_server.openai_protocol.scoring import (
    RerankRequest,
    RerankResponse,
    ScoreRequest,
    ScoreResponse,
)

router = APIRouter(tags=["openai"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in {
        400: "Invalid parameters, too many or too long texts, or not an embedding model",
        401: "Missing, invalid or revoked API key",
        404: "Unknown model",
        429: "Rate limit or concurrency limit (see Retry-After)",
        500: "The embedding failed",
        503: "No worker serves the model right now",
    }.items()
}


async def _rerank(
    request: Request,
    response: Response,
    body: RerankRequest,
    caller: ApiCaller,
    session: SessionDep,
    serving: ScoringServingDep,
) -> RerankResponse:
    """The documents ordered by their relevance to the query, best first."""
    return respond(await serving.rerank(session, caller, body, request.is_disconnected), response)


async def _score(
    request: Request,
    response: Response,
    body: ScoreRequest,
    caller: ApiCaller,
    session: SessionDep,
    serving: ScoringServingDep,
) -> ScoreResponse:
    """The similarity of ``text_1`` to ``text_2``: one against one, one against each, or pairwise."""
    return respond(await serving.score(session, caller, body, request.is_disconnected), response)


for _path in ("/v1/rerank", "/rerank", "/v2/rerank"):
    router.add_api_route(
        _path,
        _rerank,
        methods=["POST"],
        response_model=RerankResponse,
        responses=_ERRORS,
        include_in_schema=_path == "/v1/rerank",
        summary="Rerank documents by relevance to a query",
    )
for _path in ("/v1/score", "/score"):
    router.add_api_route(
        _path,
        _score,
        methods=["POST"],
        response_model=ScoreResponse,
        responses=_ERRORS,
        include_in_schema=_path == "/v1/score",
        summary="Score the similarity of text pairs",
    )
