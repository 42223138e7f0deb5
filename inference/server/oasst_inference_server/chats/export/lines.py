"""The export as a stream of JSON lines, one message tree per chat, read a batch of chats at a time."""

from __future__ import annotations

from collections.abc import AsyncIterator

from loguru import logger
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.chats.export.anonymizing import Anonymizer
from oasst_inference_server.chats.export.reading import read_chat_batches
from oasst_inference_server.chats.export.selection import ExportSelection
from oasst_inference_server.chats.export.trees import build_tree

# Chats per batch: a chat holds at most max_messages_per_chat messages, so a batch is bounded too.
DEFAULT_BATCH_CHATS = 100


async def export_lines(
    sessions: async_sessionmaker[AsyncSession],
    selection: ExportSelection,
    batch_size: int = DEFAULT_BATCH_CHATS,
    anonymizer: Anonymizer | None = None,
) -> AsyncIterator[str]:
    """Each selected chat's tree as a line of JSON ending in a newline (chats without a prompt have none),
    its ids hashed if an ``anonymizer`` is given."""
    trees = 0
    async for batch in read_chat_batches(sessions, selection, batch_size):
        for records in batch:
            tree = build_tree(records)
            if tree is not None:
                if anonymizer is not None:
                    tree = anonymizer.tree(tree)
                trees += 1
                yield tree.to_line() + "\n"
    logger.info("export finished: {} message trees", trees)
