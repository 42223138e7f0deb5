"""Settings section: the moderation hook (off by default; docs/operating.md#moderation)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

ModerationAction = Literal["flag", "refuse", "replace"]

MAX_WORD_LIST_CATEGORIES = 32
MAX_PATTERNS = 500  # over all categories
MAX_PATTERN_LENGTH = 100
MAX_CLASSIFIER_CATEGORIES = 16
MAX_CLASSIFIER_EXAMPLES = 32  # per category
MAX_EXAMPLE_LENGTH = 2000
MAX_CATEGORY_NAME = 64


class ClassifierCategory(BaseModel):
    """A category of the classifier: example texts, and the cosine similarity to the nearest of them at
    or above which a text is in the category."""

    examples: list[str] = Field(min_length=1, max_length=MAX_CLASSIFIER_EXAMPLES)
    threshold: float = Field(default=0.8, gt=-1.0, le=1.0)

    @model_validator(mode="after")
    def _bounded(self) -> ClassifierCategory:
        if any(not e.strip() or len(e) > MAX_EXAMPLE_LENGTH for e in self.examples):
            raise ValueError(
                f"a classifier example must be non-empty and at most {MAX_EXAMPLE_LENGTH} characters"
            )
        return self


def _check_category_names(names: list[str], what: str) -> None:
    for name in names:
        if (
            not name
            or len(name) > MAX_CATEGORY_NAME
            or not name.replace("_", "").replace("-", "").replace("/", "").isalnum()
        ):
            raise ValueError(
                f"{what}: category {name[:80]!r} must be 1-{MAX_CATEGORY_NAME} letters, digits, _ - /"
            )


class _ModerationSettings(BaseModel):
    """Settings: moderation."""

    moderation_enabled: bool = Field(
        default=False,
        description="Run the moderation hook on prompts and answers (the word list and, if configured, the "
        "classifier); /v1/moderations answers only when it is on",
    )
    moderation_check_requests: bool = Field(
        default=True, description="With moderation on: check prompts before they are queued"
    )
    moderation_check_answers: bool = Field(
        default=True, description="With moderation on: check answers while they stream and when they end"
    )
    moderation_word_lists: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Category -> words or phrases, matched case-insensitively as whole words; an entry "
        f"starting with re: is a regular expression of a safe subset (no groups under a repeat, no "
        f"back-references or look-arounds). At most {MAX_PATTERNS} entries of {MAX_PATTERN_LENGTH} "
        f"characters, {MAX_WORD_LIST_CATEGORIES} categories (JSON)",
    )
    moderation_classifier_model: str | None = Field(
        default=None,
        max_length=128,
        description="An embedding model config whose workers classify texts: a text is in a category when "
        "its embedding's cosine similarity to one of the category's examples reaches the threshold",
    )
    moderation_classifier_categories: dict[str, ClassifierCategory] = Field(
        default_factory=dict,
        description='Category -> {"examples": [texts], "threshold": cosine similarity} for the classifier '
        f"(JSON; at most {MAX_CLASSIFIER_CATEGORIES} categories of {MAX_CLASSIFIER_EXAMPLES} examples)",
    )
    moderation_classifier_timeout: float = Field(
        default=20.0, gt=0, le=300, description="Seconds a classification may take (its embedding job)"
    )
    moderation_classifier_stride_chars: int = Field(
        default=400,
        ge=20,
        le=100_000,
        description="While an answer streams, it is classified again after this many new characters",
    )
    moderation_fail_closed: bool = Field(
        default=False,
        description="A classification that fails or times out counts as flagged (refused); off: let through",
    )
    moderation_default_action: ModerationAction = Field(
        default="refuse", description="What a flagged text gets unless moderation_actions names its category"
    )
    moderation_actions: dict[str, ModerationAction] = Field(
        default_factory=dict, description="Category -> flag (record, let through), refuse or replace (JSON)"
    )
    moderation_replacement: str = Field(
        default="[This message was removed by moderation.]",
        min_length=1,
        max_length=1000,
        description="The text that replaces a flagged text whose action is replace",
    )
    moderation_max_scan_chars: int = Field(
        default=20_000,
        ge=100,
        le=1_000_000,
        description="Characters of a text checked (the last ones of an answer, the first of a prompt turn)",
    )

    @model_validator(mode="after")
    def _moderation_bounds(self) -> _ModerationSettings:
        lists = self.moderation_word_lists
        if len(lists) > MAX_WORD_LIST_CATEGORIES:
            raise ValueError(f"moderation_word_lists: at most {MAX_WORD_LIST_CATEGORIES} categories")
        _check_category_names(list(lists), "moderation_word_lists")
        if sum(len(p) for p in lists.values()) > MAX_PATTERNS:
            raise ValueError(f"moderation_word_lists: at most {MAX_PATTERNS} entries in all")
        for patterns in lists.values():
            for pattern in patterns:
                if not pattern.strip() or len(pattern) > MAX_PATTERN_LENGTH:
                    raise ValueError(
                        f"moderation_word_lists: entry {pattern[:40]!r} must be 1-{MAX_PATTERN_LENGTH} characters"
                    )
        categories = self.moderation_classifier_categories
        if len(categories) > MAX_CLASSIFIER_CATEGORIES:
            raise ValueError(
                f"moderation_classifier_categories: at most {MAX_CLASSIFIER_CATEGORIES} categories"
            )
        _check_category_names(list(categories), "moderation_classifier_categories")
        if categories and not self.moderation_classifier_model:
            raise ValueError("moderation_classifier_categories needs moderation_classifier_model")
        _check_category_names(list(self.moderation_actions), "moderation_actions")
        return self
