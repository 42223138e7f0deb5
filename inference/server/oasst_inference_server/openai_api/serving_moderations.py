"""``/v1/moderations`` answered by the moderation hook: every configured category of each text, flagged or
not, with its score (the word list's 1 or 0, the classifier's cosine similarity). The classifier's
embedding job is the caller's, with their limits, as a ``/v1/embeddings`` request is."""

from __future__ import annotations

from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.auth.caller import Caller
from oasst_inference_server.db.models import new_id
from oasst_inference_server.domain_errors import NotFound, ServiceUnavailable
from oasst_inference_server.moderation.classifier import ClassifierUnavailable
from oasst_inference_server.moderation.hook import Moderation
from oasst_inference_server.openai_api.openai_service import IsDisconnected, OpenAIService
from oasst_inference_server.openai_api.served import Answer
from oasst_inference_server.openai_protocol.moderations import (
    ModerationRequest,
    ModerationResponse,
    ModerationResult,
)

MODEL_NAME = "oasst-moderation"


class ModerationServing:
    def __init__(self, service: OpenAIService, moderation: Moderation) -> None:
        self.service = service
        self.moderation = moderation

    async def create(
        self, session: AsyncSession, caller: Caller, body: ModerationRequest, is_disconnected: IsDisconnected
    ) -> Answer[ModerationResponse]:
        moderation = self.moderation
        if not moderation.enabled:
            raise NotFound("moderation_disabled", "the moderation hook is off on this server")
        texts = [text[: moderation.max_scan] for text in body.inputs]
        scores: list[dict[str, float]] = [dict.fromkeys(moderation.categories(), 0.0) for _ in texts]
        for index, finding in enumerate(await moderation.word_list.find(caller.user.id, texts)):
            if finding is not None:
                scores[index].update(finding.scores)
        if moderation.classifies:
            model_name = moderation.settings.moderation_classifier_model or ""

            async def embed(user_id: str, inputs: list[str]) -> list[list[float]]:
                model = await self.service.resolve_model(model_name, "embedding")
                vectors, _, _ = await self.service.embed(session, caller, model, inputs, is_disconnected)
                return vectors

            try:
                classified = await moderation.classifier_check.scores(caller.user.id, texts, embed)
            except ClassifierUnavailable as exc:
                raise ServiceUnavailable(
                    "moderation_unavailable", f"the classifier is unavailable: {exc}"
                ) from None
            for index, by_category in enumerate(classified):
                scores[index].update({c: max(0.0, min(1.0, s)) for c, s in by_category.items()})
        results = []
        for by_category in scores:
            flagged = {c: self._flagged(c, s) for c, s in by_category.items()}
            results.append(
                ModerationResult(
                    flagged=any(flagged.values()), categories=flagged, category_scores=by_category
                )
            )
        return Answer(ModerationResponse(id=f"modr-{new_id()}", model=MODEL_NAME, results=results))

    def _flagged(self, category: str, score: float) -> bool:
        classifier = self.moderation.settings.moderation_classifier_categories.get(category)
        return score >= classifier.threshold if classifier is not None else score >= 1.0
