"""The flagged texts: one row per flag (``moderation_flag``), written as the hook acts, listed for admins."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.db.models import DbChat, DbMessage, DbModerationFlag

MAX_EXCERPT = 500


class ModerationFlagRead(BaseModel):
    """A flag as ``GET /admin/moderation/flags`` lists it."""

    id: str
    message_id: str | None  # None: a request refused before anything was stored
    chat_id: str | None
    user_id: str
    stage: Literal["request", "answer"]
    check: str
    action: Literal["flag", "refuse", "replace"]
    categories: list[str]
    excerpt: str
    created_at: datetime


def excerpt_around(text: str, at: int | None) -> str:
    """At most :data:`MAX_EXCERPT` characters of ``text``, around position ``at`` where one is known."""
    if len(text) <= MAX_EXCERPT:
        return text
    start = 0 if at is None else max(0, min(at - MAX_EXCERPT // 4, len(text) - MAX_EXCERPT))
    return text[start : start + MAX_EXCERPT]


class FlagStore:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def record(
        self,
        *,
        user_id: str | None,
        message_id: str | None,
        chat_id: str | None,
        stage: str,
        check: str,
        action: str,
        categories: list[str],
        excerpt: str,
    ) -> None:
        """Write one flag; an answer's user and chat are read from its message when not given."""
        async with self._sessions() as session:
            if message_id is not None and user_id is None:
                user_id, its_chat = await self._owner(session, message_id)
                chat_id = chat_id or its_chat
            session.add(
                DbModerationFlag(
                    message_id=message_id,
                    chat_id=chat_id,
                    user_id=user_id or "",
                    stage=stage,
                    check=check,
                    action=action,
                    categories=categories,
                    excerpt=excerpt[:MAX_EXCERPT],
                )
            )
            await session.commit()

    async def user_of(self, message_id: str) -> str | None:
        """Whose message it is: its own user (an API request's) or its chat's owner (a chat answer's)."""
        async with self._sessions() as session:
            user_id, _ = await self._owner(session, message_id)
            return user_id

    @staticmethod
    async def _owner(session: AsyncSession, message_id: str) -> tuple[str | None, str | None]:
        """The message's user (its own, else its chat owner's) and chat; (None, None) for no message."""
        row = (
            await session.exec(
                select(DbMessage.user_id, DbMessage.chat_id).where(col(DbMessage.id) == message_id)
            )
        ).first()
        if row is None:
            return None, None
        user_id, chat_id = row
        if user_id is None and chat_id is not None:
            user_id = (await session.exec(select(DbChat.user_id).where(col(DbChat.id) == chat_id))).first()
        return user_id, chat_id

    async def answer_flag(self, message_id: str) -> DbModerationFlag | None:
        """The flag that cut or replaced an answer, if any."""
        async with self._sessions() as session:
            result = await session.exec(
                select(DbModerationFlag)
                .where(
                    col(DbModerationFlag.message_id) == message_id,
                    col(DbModerationFlag.stage) == "answer",
                    col(DbModerationFlag.action) != "flag",
                )
                .limit(1)
            )
            return result.first()

    async def page(self, limit: int, before: datetime | None) -> list[ModerationFlagRead]:
        """The newest flags first, ``limit`` of them, created before ``before`` if given."""
        async with self._sessions() as session:
            query = select(DbModerationFlag)
            if before is not None:
                query = query.where(col(DbModerationFlag.created_at) < before)
            query = query.order_by(col(DbModerationFlag.created_at).desc(), col(DbModerationFlag.id)).limit(
                limit
            )
            rows = (await session.exec(query)).all()
        return [ModerationFlagRead.model_validate(row, from_attributes=True) for row in rows]
