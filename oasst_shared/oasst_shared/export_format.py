"""The Open-Assistant export format: JSON lines, one message tree per line.

Field names and shapes are those of the original project's ``oasst_data`` package
(``ExportMessageTree``, ``ExportMessageNode``, ``ExportMessageEvent*``), so the tools that read its
datasets read ours. Lines are written without their unset (None) fields, as the original export does.
What each field holds for this server is documented in docs/operating.md#exporting-the-conversations-dataset-export.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class _ExportModel(BaseModel):
    model_config = ConfigDict(protected_namespaces=())


class LabelAvgValue(_ExportModel):
    value: float | None
    count: int


LabelValues = dict[str, LabelAvgValue]


class ExportMessageEventScore(_ExportModel):
    """A vote on an answer: 1 good, -1 bad."""

    type: Literal["score"] = "score"
    user_id: str | None
    score: int = Field(ge=-1, le=1)


class ExportMessageEventReport(_ExportModel):
    type: Literal["report"] = "report"
    user_id: str | None
    report_type: str
    reason: str


class ExportMessageEventRanking(_ExportModel):
    """Answers to one prompt in order of preference (on the prompt's node, as the original stores it)."""

    type: Literal["ranking"] = "ranking"
    user_id: str | None
    ranking: list[int]
    ranked_message_ids: list[str]
    ranking_parent_id: str | None = None
    message_tree_id: str | None = None
    not_rankable: bool | None = None


ExportMessageEvent = Annotated[
    ExportMessageEventScore | ExportMessageEventReport | ExportMessageEventRanking,
    Field(discriminator="type"),
]


class ExportMessageNode(_ExportModel):
    message_id: str
    parent_id: str | None = None
    user_id: str | None = None
    created_date: datetime | None = None
    text: str
    role: Literal["prompter", "assistant"]
    lang: str | None = None
    review_count: int | None = None
    review_result: bool | None = None
    deleted: bool | None = None
    rank: int | None = None
    synthetic: bool | None = None
    model_name: str | None = None
    emojis: dict[str, int] | None = None
    replies: list[ExportMessageNode] | None = None
    labels: LabelValues | None = None
    events: dict[str, list[ExportMessageEvent]] | None = None
    # Always None inside a tree (the tree carries them), as in the original.
    message_tree_id: str | None = None
    tree_state: str | None = None


class ExportMessageTree(_ExportModel):
    message_tree_id: str
    tree_state: str | None = None
    prompt: ExportMessageNode | None = None
    origin: str | None = None

    def to_line(self) -> str:
        """The tree as one line of the export (no trailing newline), unset fields left out."""
        return self.model_dump_json(exclude_none=True)
