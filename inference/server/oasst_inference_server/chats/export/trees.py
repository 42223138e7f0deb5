"""One chat as an Open-Assistant message tree: its first prompt is the root, each answer and follow-up
nests under the message it replies to, and the feedback becomes the original's events.

- a vote (the owner's ``score``) is a ``score`` event and an emoji count (``+1`` / ``-1``);
- a report is a ``report`` event;
- an evaluation (this answer over those siblings) is a ``ranking`` event on the prompt, the preferred
  answer first, as the original keeps rankings on the parent; the prompt's latest evaluation also sets
  ``rank``: 0 for the preferred answer, 1 for those it was preferred over.
"""

from __future__ import annotations

from collections import defaultdict
from math import inf

from oasst_inference_server.chats.export.reading import ChatRecords
from oasst_inference_server.db.models import DbMessage, DbMessageEvaluation
from oasst_shared.export_format import (
    ExportMessageEvent,
    ExportMessageEventRanking,
    ExportMessageEventReport,
    ExportMessageEventScore,
    ExportMessageNode,
    ExportMessageTree,
)
from oasst_shared.schemas import Role

# A chat is not a crowd-sourced tree: it has no review states (the original inference server's word).
TREE_STATE = "not_applicable"
_EMOJI_OF_SCORE = {1: "+1", -1: "-1"}


def _ranking(
    evaluation: DbMessageEvaluation, exported: dict[str, DbMessage]
) -> ExportMessageEventRanking | None:
    ranked = [evaluation.selected_message_id, *evaluation.inferior_message_ids]
    ranked = [m for m in ranked if m in exported]
    if evaluation.selected_message_id not in exported or len(ranked) < 2:
        return None  # the preferred answer or all the others did not complete: nothing to compare
    return ExportMessageEventRanking(
        user_id=evaluation.user_id,
        ranking=list(range(len(ranked))),
        ranked_message_ids=ranked,
        ranking_parent_id=exported[evaluation.selected_message_id].parent_id,
        message_tree_id=evaluation.chat_id,
    )


def _events(
    records: ChatRecords, exported: dict[str, DbMessage]
) -> dict[str, dict[str, list[ExportMessageEvent]]]:
    """Per message id: its events by type."""
    events: dict[str, dict[str, list[ExportMessageEvent]]] = defaultdict(dict)
    for message in exported.values():
        if message.role == Role.assistant and message.score:
            vote = ExportMessageEventScore(user_id=records.chat.user_id, score=message.score)
            events[message.id]["score"] = [vote]
    for report in records.reports:
        if report.message_id in exported:
            event = ExportMessageEventReport(
                user_id=report.user_id, report_type=report.report_type, reason=report.reason
            )
            events[report.message_id].setdefault("report", []).append(event)
    for evaluation in records.evaluations:
        ranking = _ranking(evaluation, exported)
        if ranking is not None and ranking.ranking_parent_id is not None:
            events[ranking.ranking_parent_id].setdefault("ranking", []).append(ranking)
    return events


def _ranks(records: ChatRecords, exported: dict[str, DbMessage]) -> dict[str, int]:
    """Per answer: its rank among its siblings by the latest evaluation of their prompt."""
    latest: dict[str | None, DbMessageEvaluation] = {}
    for evaluation in records.evaluations:  # oldest first: the latest wins
        selected = exported.get(evaluation.selected_message_id)
        if selected is not None:
            latest[selected.parent_id] = evaluation
    ranks: dict[str, int] = {}
    for evaluation in latest.values():
        ranks.update({m: 1 for m in evaluation.inferior_message_ids if m in exported})
        ranks[evaluation.selected_message_id] = 0
    return ranks


def _node(
    records: ChatRecords, message: DbMessage, rank: int | None, events: dict[str, list[ExportMessageEvent]]
) -> ExportMessageNode:
    assistant = message.role == Role.assistant
    return ExportMessageNode(
        message_id=message.id,
        parent_id=message.parent_id,
        user_id=records.chat.user_id,
        created_date=message.created_at,
        text=message.content or "",
        role=message.role.value,
        deleted=records.owner_deleted,
        rank=rank,
        synthetic=assistant,
        model_name=message.model_config_name if assistant else None,
        emojis={_EMOJI_OF_SCORE[message.score]: 1} if assistant and message.score else None,
        events=events or None,
        replies=[],
    )


def build_tree(records: ChatRecords) -> ExportMessageTree | None:
    """The chat's tree, or None for a chat without a prompt. Messages that do not reach the root through
    exported messages (a follow-up to an answer that failed cannot exist, but a row may be odd) are left out."""
    exported = {m.id: m for m in records.messages}
    roots = [m for m in records.messages if m.parent_id is None and m.role == Role.prompter]
    if not roots:
        return None
    events = _events(records, exported)
    ranks = _ranks(records, exported)
    nodes = {m.id: _node(records, m, ranks.get(m.id), events.get(m.id, {})) for m in records.messages}
    for message in records.messages:  # oldest first, so siblings keep their order among equal ranks
        if message.parent_id is not None and message.parent_id in nodes:
            parent = nodes[message.parent_id]
            assert parent.replies is not None
            parent.replies.append(nodes[message.id])
    for node in nodes.values():
        assert node.replies is not None
        node.replies.sort(key=lambda n: n.rank if n.rank is not None else inf)
    return ExportMessageTree(
        message_tree_id=records.chat.id, tree_state=TREE_STATE, prompt=nodes[roots[0].id]
    )
