"""A strict reader of the Open-Assistant export format, for tests.

Written from the original project's ``oasst_data/schemas.py`` (``ExportMessageTree``,
``ExportMessageNode``, ``ExportMessageEvent*``, ``LabelAvgValue``), independently of the server's own
``oasst_shared.export_format``: a field the original does not have is refused (``extra="forbid"``), and the
fields the original requires (pydantic 1 made the ``X | None`` fields without a default optional) are
required here. ``check_tree`` walks a tree and checks that every reply nests under its parent.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

# The original's field names, as a reader of its datasets expects them.
NODE_FIELDS = {
    "message_id", "parent_id", "user_id", "created_date", "text", "role", "lang", "review_count",
    "review_result", "deleted", "rank", "synthetic", "model_name", "emojis", "replies", "labels", "events",
    "detoxify", "message_tree_id", "tree_state",
}  # fmt: skip
TREE_FIELDS = {"message_tree_id", "tree_state", "prompt", "origin"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=(), strict=False)


class LabelAvgValue(_Strict):
    value: float | None = None
    count: int


class Emoji(_Strict):
    type: Literal["emoji"]
    user_id: str | None = None
    emoji: str


class Rating(_Strict):
    type: Literal["rating"]
    user_id: str | None = None
    rating: str


class Ranking(_Strict):
    type: Literal["ranking"]
    user_id: str | None = None
    ranking: list[int]
    ranked_message_ids: list[str]
    ranking_parent_id: str | None = None
    message_tree_id: str | None = None
    not_rankable: bool | None = None


class Report(_Strict):
    type: Literal["report"]
    user_id: str | None = None
    report_type: str
    reason: str


class Score(_Strict):
    type: Literal["score"]
    user_id: str | None = None
    score: int = Field(ge=-1, le=1)


Event = Annotated[Emoji | Rating | Ranking | Report | Score, Field(discriminator="type")]


class Detoxify(_Strict):
    toxicity: float
    severe_toxicity: float
    obscene: float
    identity_attack: float
    insult: float
    threat: float
    sexual_explicit: float


class Node(_Strict):
    message_id: str
    parent_id: str | None = None
    user_id: str | None = None
    created_date: datetime | None = None
    text: str
    role: str
    lang: str | None = None
    review_count: int | None = None
    review_result: bool | None = None
    deleted: bool | None = None
    rank: int | None = None
    synthetic: bool | None = None
    model_name: str | None = None
    emojis: dict[str, int] | None = None
    replies: list[Node] | None = None
    labels: dict[str, LabelAvgValue] | None = None
    events: dict[str, list[Event]] | None = None
    detoxify: Detoxify | None = None
    message_tree_id: str | None = None
    tree_state: str | None = None


class Tree(_Strict):
    message_tree_id: str
    tree_state: str | None = None
    prompt: Node | None = None
    origin: str | None = None


def walk(node: Node) -> list[Node]:
    """The node and everything under it, depth first."""
    nodes = [node]
    for reply in node.replies or []:
        nodes.extend(walk(reply))
    return nodes


def check_tree(tree: Tree) -> dict[str, Node]:
    """Check the tree's shape and return its nodes by id: the prompt is a root prompter message, each
    reply names its parent and takes the other role, ids are unique, events are keyed by their type,
    and the tree's fields are only on the tree."""
    assert tree.prompt is not None, tree
    assert tree.prompt.parent_id is None and tree.prompt.role == "prompter"
    nodes: dict[str, Node] = {}
    for node in walk(tree.prompt):
        assert node.message_id not in nodes, f"{node.message_id} twice"
        nodes[node.message_id] = node
        assert node.role in ("prompter", "assistant")
        assert node.message_tree_id is None and node.tree_state is None  # the tree carries them
        for reply in node.replies or []:
            assert reply.parent_id == node.message_id, (reply.message_id, node.message_id)
            assert reply.role != node.role, f"{reply.role} answers {node.role}"
        for key, events in (node.events or {}).items():
            assert events and all(e.type == key for e in events), (key, events)
    return nodes


def read_lines(text: str) -> list[Tree]:
    """Each line of an export as a tree (an empty export is no lines); every line ends in a newline."""
    assert text == "" or text.endswith("\n")
    return [Tree.model_validate_json(line) for line in text.splitlines()]
