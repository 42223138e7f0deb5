"""Replacing the ids of an exported tree with keyed hashes, as the original export's ``--anonymizer-seed``
does: the same id and seed give the same hash in every tree (so replies, rankings and users still match
up across the export), and without the seed the ids cannot be recovered. Stateless, unlike the
original's table of ids, so an export of any size holds nothing per id."""

from __future__ import annotations

import hashlib
import hmac

from oasst_shared.export_format import (
    ExportMessageEventRanking,
    ExportMessageNode,
    ExportMessageTree,
)

MIN_SEED_LENGTH = 16


class Anonymizer:
    def __init__(self, seed: str) -> None:
        if len(seed) < MIN_SEED_LENGTH:
            raise ValueError(f"an anonymizer seed has at least {MIN_SEED_LENGTH} characters")
        self._key = seed.encode()

    def __call__(self, collection: str, key: str) -> str:
        return hmac.new(self._key, f"{collection}:{key}".encode(), hashlib.sha256).hexdigest()

    def optional(self, collection: str, key: str | None) -> str | None:
        return None if key is None else self(collection, key)

    def tree(self, tree: ExportMessageTree) -> ExportMessageTree:
        """The tree with its ids hashed (in place, and returned)."""
        tree.message_tree_id = self("message_tree", tree.message_tree_id)
        pending = [tree.prompt] if tree.prompt is not None else []
        while pending:
            node = pending.pop()
            self._node(node)
            pending.extend(node.replies or [])
        return tree

    def _node(self, node: ExportMessageNode) -> None:
        node.message_id = self("message", node.message_id)
        node.parent_id = self.optional("message", node.parent_id)
        node.user_id = self.optional("user", node.user_id)
        for events in (node.events or {}).values():
            for event in events:
                event.user_id = self.optional("user", event.user_id)
                if isinstance(event, ExportMessageEventRanking):
                    event.ranked_message_ids = [self("message", m) for m in event.ranked_message_ids]
                    event.ranking_parent_id = self.optional("message", event.ranking_parent_id)
                    event.message_tree_id = self.optional("message_tree", event.message_tree_id)
