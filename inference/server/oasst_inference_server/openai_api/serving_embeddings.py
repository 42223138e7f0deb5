"""``/v1/embeddings``: the inputs embedded by an embedding model's workers, one vector per input in input
order (one job on the shared queue, as a generation is)."""

from __future__ import annotations

from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.auth.caller import Caller
from oasst_inference_server.openai_api.openai_service import IsDisconnected, OpenAIService
from oasst_inference_server.openai_api.served import Answer
from oasst_inference_server.openai_protocol.embeddings import (
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    encode_embedding_base64,
)
from oasst_inference_server.openai_protocol.usage import UsageInfo


class EmbeddingServing:
    def __init__(self, service: OpenAIService) -> None:
        self.service = service

    async def create(
        self, session: AsyncSession, caller: Caller, body: EmbeddingRequest, is_disconnected: IsDisconnected
    ) -> Answer[EmbeddingResponse]:
        """The vectors, as floats or base64 (``encoding_format``); ``X-Request-Id``: the job's id."""
        model = await self.service.resolve_model(body.model, "embedding")
        vectors, prompt_tokens, request_id = await self.service.embed(
            session, caller, model, body.inputs, is_disconnected
        )
        as_base64 = body.encoding_format == "base64"
        response = EmbeddingResponse(
            data=[
                EmbeddingData(index=i, embedding=encode_embedding_base64(v) if as_base64 else v)
                for i, v in enumerate(vectors)
            ],
            model=model.config.name,
            usage=UsageInfo(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens),
        )
        return Answer(response, {"X-Request-Id": request_id})
