"""The moderation classifier's embeddings, from the fleet (:class:`..moderation.classifier.Embedder`): a job
on the classifier's embedding model, on the queue every embedding takes, on behalf of the user whose text it
is. Not counted against the user's limits: the request that needs it was admitted already."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.db.models import DbUser
from oasst_inference_server.moderation.classifier import ClassifierUnavailable
from oasst_inference_server.openai_api.openai_service import OpenAIService


class ModerationEmbedder:
    def __init__(
        self, service: OpenAIService, sessions: async_sessionmaker[AsyncSession], model_name: str
    ) -> None:
        self._service = service
        self._sessions = sessions
        self._model_name = model_name

    async def __call__(self, user_id: str, texts: list[str]) -> list[list[float]]:
        model = await self._service.resolve_model(self._model_name, "embedding")
        async with self._sessions() as session:
            user = await session.get(DbUser, user_id)
        if user is None:
            raise ClassifierUnavailable(f"no user {user_id!r} to classify for")
        return await self._service.embed_unmetered(user, model, texts)
