"""The moderation hook: the checks (the word list, the classifier, any other :class:`Check`), the action
for what they find, and the flags they leave.

A check looks at texts and returns, for each, the categories it found (and its scores). The action of a
text is the strictest of its categories' (``moderation_actions``, else ``moderation_default_action``):
refuse, then replace, then flag. Every flagged text is recorded (:mod:`.flags`), whatever its action.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from loguru import logger
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.domain_errors import ContentRefused
from oasst_inference_server.moderation.classifier import Classifier, ClassifierUnavailable, Embedder
from oasst_inference_server.moderation.flags import FlagStore, excerpt_around
from oasst_inference_server.moderation.word_list import WordList
from oasst_inference_server.settings import Settings
from oasst_inference_server.settings_sections.moderation import ModerationAction

Stage = Literal["request", "answer"]
_SEVERITY: dict[str, int] = {"flag": 0, "replace": 1, "refuse": 2}


@dataclass(frozen=True)
class Finding:
    """What one check found in one text."""

    check: str
    categories: list[str]
    scores: dict[str, float] = field(default_factory=dict)
    at: int | None = None  # where in the text (the word list knows; the classifier does not)


@dataclass(frozen=True)
class Verdict:
    """A flagged text: what found it, in which categories, and the action taken."""

    check: str
    categories: list[str]
    action: ModerationAction
    excerpt: str
    at: int | None = None

    def refusal(self, stage: Stage) -> ContentRefused:
        what = "prompt" if stage == "request" else "answer"
        return ContentRefused(
            "content_policy_violation",
            f"the {what} was refused by moderation ({self.check}: {', '.join(self.categories)})",
            categories=self.categories,
        )


class Check(Protocol):
    """A pluggable check: ``name`` names it in flags; ``find`` looks at each text."""

    name: str

    async def find(self, user_id: str, texts: list[str]) -> list[Finding | None]: ...


class WordListCheck:
    name = "word_list"

    def __init__(self, words: WordList) -> None:
        self.words = words

    def find_one(self, text: str) -> Finding | None:
        hits = self.words.scan(text)
        if not hits:
            return None
        return Finding(self.name, [h.category for h in hits], {h.category: 1.0 for h in hits}, hits[0].start)

    async def find(self, user_id: str, texts: list[str]) -> list[Finding | None]:
        return [self.find_one(text) for text in texts]


class ClassifierCheck:
    name = "classifier"

    def __init__(self, classifier: Classifier, fail_closed: bool) -> None:
        self.classifier = classifier
        self.fail_closed = fail_closed

    async def find(self, user_id: str, texts: list[str]) -> list[Finding | None]:
        try:
            results = await self.classifier.classify(user_id, texts)
        except ClassifierUnavailable as exc:
            logger.warning("moderation classifier unavailable: {}", exc)
            if self.fail_closed:
                return [Finding(self.name, ["classifier_unavailable"]) for _ in texts]
            return [None for _ in texts]
        return [Finding(self.name, r.flagged, r.scores) if r.flagged else None for r in results]

    async def scores(
        self, user_id: str, texts: list[str], embedder: Embedder | None
    ) -> list[dict[str, float]]:
        """Each text's score per category (``ClassifierUnavailable`` if there are none)."""
        return [r.scores for r in await self.classifier.classify(user_id, texts, embedder)]


class Moderation:
    """The hook, built once at startup (off unless ``moderation_enabled``)."""

    def __init__(
        self, settings: Settings, sessions: async_sessionmaker[AsyncSession], words: WordList | None = None
    ) -> None:
        self.settings = settings
        self.enabled = settings.moderation_enabled
        self.flags = FlagStore(sessions)
        self.word_list = WordListCheck(
            words if words is not None else WordList(settings.moderation_word_lists)
        )
        self.classifier = Classifier(
            settings.moderation_classifier_categories, settings.moderation_classifier_timeout
        )
        self.classifier_check = ClassifierCheck(self.classifier, settings.moderation_fail_closed)
        self.checks: list[Check] = []
        if self.word_list.words:
            self.checks.append(self.word_list)
        if self.classifier:
            self.checks.append(self.classifier_check)
        self.max_scan = settings.moderation_max_scan_chars

    @property
    def on_requests(self) -> bool:
        return self.enabled and self.settings.moderation_check_requests and bool(self.checks)

    @property
    def on_answers(self) -> bool:
        return self.enabled and self.settings.moderation_check_answers and bool(self.checks)

    @property
    def classifies(self) -> bool:
        return bool(self.classifier)

    def categories(self) -> list[str]:
        return [*self.settings.moderation_word_lists, *self.settings.moderation_classifier_categories]

    def action_of(self, categories: Sequence[str]) -> ModerationAction:
        actions = self.settings.moderation_actions
        default = self.settings.moderation_default_action
        return max((actions.get(c, default) for c in categories), key=_SEVERITY.__getitem__)

    def verdict(self, finding: Finding, text: str) -> Verdict:
        return Verdict(
            finding.check,
            finding.categories,
            self.action_of(finding.categories),
            excerpt_around(text, finding.at),
            finding.at,
        )

    async def judge(
        self, user_id: str, texts: list[str], checks: Sequence[Check] | None = None
    ) -> list[Verdict | None]:
        """Each text's verdict: the strictest of the checks' (the first check's on a tie), or None."""
        bounded = [text[: self.max_scan] for text in texts]
        verdicts: list[Verdict | None] = [None] * len(texts)
        for check in self.checks if checks is None else checks:
            pending = [i for i, v in enumerate(verdicts) if v is None or v.action != "refuse"]
            if not pending:
                break
            findings = await check.find(user_id, [bounded[i] for i in pending])
            for index, finding in zip(pending, findings, strict=True):
                if finding is None:
                    continue
                found = self.verdict(finding, bounded[index])
                current = verdicts[index]
                if current is None or _SEVERITY[found.action] > _SEVERITY[current.action]:
                    verdicts[index] = found
        return verdicts

    async def record(
        self,
        verdict: Verdict,
        stage: Stage,
        *,
        user_id: str | None,
        message_id: str | None = None,
        chat_id: str | None = None,
    ) -> None:
        try:
            await self.flags.record(
                user_id=user_id,
                message_id=message_id,
                chat_id=chat_id,
                stage=stage,
                check=verdict.check,
                action=verdict.action,
                categories=verdict.categories,
                excerpt=verdict.excerpt,
            )
        except Exception as exc:  # a flag that cannot be written must not fail the request
            logger.opt(exception=exc).error("could not record a moderation flag ({})", stage)
        logger.info(
            "moderation: {} {} by {} ({}), message {}",
            stage,
            verdict.action,
            verdict.check,
            ",".join(verdict.categories),
            message_id,
        )

    async def moderate_request(
        self,
        user_id: str,
        texts: list[str],
        *,
        message_id: str | None = None,
        chat_id: str | None = None,
    ) -> list[str]:
        """Check a request's texts (its user-written turns) before it is queued: records every flag,
        raises ``ContentRefused`` for a refused one, and returns the texts with the replaced ones replaced."""
        if not self.on_requests or not texts:
            return texts
        verdicts = await self.judge(user_id, texts)
        out = list(texts)
        refused: Verdict | None = None
        for index, verdict in enumerate(verdicts):
            if verdict is None:
                continue
            await self.record(verdict, "request", user_id=user_id, message_id=message_id, chat_id=chat_id)
            if verdict.action == "refuse" and refused is None:
                refused = verdict
            elif verdict.action == "replace":
                out[index] = self.settings.moderation_replacement
        if refused is not None:
            raise refused.refusal("request")
        return out
