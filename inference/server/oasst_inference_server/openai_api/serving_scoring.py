"""Rerank and score on embedding models (``/v1/rerank``, ``/v1/score`` and their aliases): each request
is one ``/v1/embeddings`` job of its texts (same queue, limits and usage); the scores are the cosine
similarities of the vectors."""

from __future__ import annotations

import time

from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.auth.caller import Caller
from oasst_inference_server.openai_api.openai_service import IsDisconnected, OpenAIService
from oasst_inference_server.openai_api.served import Answer
from oasst_inference_server.openai_api.similarity import cosine
from oasst_inference_server.openai_protocol.scoring import (
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
)
from oasst_inference_server.openai_protocol.usage import UsageInfo


class ScoringServing:
    def __init__(self, service: OpenAIService) -> None:
        self.service = service

    async def _embed(
        self,
        session: AsyncSession,
        caller: Caller,
        model_name: str,
        texts: list[str],
        is_disconnected: IsDisconnected,
    ) -> tuple[str, list[list[float]], int, str]:
        model = await self.service.resolve_model(model_name, "embedding")
        vectors, tokens, request_id = await self.service.embed(session, caller, model, texts, is_disconnected)
        return model.config.name, vectors, tokens, request_id

    async def rerank(
        self, session: AsyncSession, caller: Caller, body: RerankRequest, is_disconnected: IsDisconnected
    ) -> Answer[RerankResponse]:
        """The documents ordered by their relevance to the query, best first."""
        texts = body.texts
        name, vectors, tokens, request_id = await self._embed(
            session, caller, body.model, [body.query, *texts], is_disconnected
        )
        query, documents = vectors[0], vectors[1:]
        ranked = sorted(
            (
                RerankResult(index=i, relevance_score=cosine(query, vector))
                for i, vector in enumerate(documents)
            ),
            key=lambda result: -result.relevance_score,
        )
        if body.top_n:
            ranked = ranked[: body.top_n]
        if body.return_documents:
            for result in ranked:
                result.document = RerankDocument(text=texts[result.index])
        response = RerankResponse(
            id=f"rerank-{request_id}",
            model=name,
            results=ranked,
            usage=UsageInfo(prompt_tokens=tokens, total_tokens=tokens),
        )
        return Answer(response, {"X-Request-Id": request_id})

    async def score(
        self, session: AsyncSession, caller: Caller, body: ScoreRequest, is_disconnected: IsDisconnected
    ) -> Answer[ScoreResponse]:
        """The similarity of ``text_1`` to ``text_2``: one against one, one against each, or pairwise."""
        lefts, rights = body.lefts, body.rights
        name, vectors, tokens, request_id = await self._embed(
            session, caller, body.model, [*lefts, *rights], is_disconnected
        )
        left_vectors, right_vectors = vectors[: len(lefts)], vectors[len(lefts) :]
        response = ScoreResponse(
            id=f"score-{request_id}",
            created=int(time.time()),
            model=name,
            data=[
                ScoreData(index=index, score=cosine(left_vectors[i], right_vectors[j]))
                for index, (i, j) in enumerate(body.pairs())
            ],
            usage=UsageInfo(prompt_tokens=tokens, total_tokens=tokens),
        )
        return Answer(response, {"X-Request-Id": request_id})
