"""A message's role and state are enums in the code and their plain values in the database."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import text
from sqlmodel import select

from oasst_inference_server.db.engine import create_engine, make_session_factory
from oasst_inference_server.db.migrations import upgrade_to_head
from oasst_inference_server.db.models import DbMessage, MessageKind
from oasst_inference_server.settings import Settings
from oasst_shared.schemas import MessageState, Role


async def test_role_and_state_are_read_as_enums_and_stored_as_their_values(tmp_path: Path) -> None:
    settings = Settings(_env_file=None, database_url=f"sqlite+aiosqlite:///{tmp_path}/enums.db")  # type: ignore[call-arg]
    engine = create_engine(settings)
    try:
        await upgrade_to_head(engine)
        sessions = make_session_factory(engine)
        async with sessions() as session:
            session.add(DbMessage(id="typed", role=Role.assistant, state=MessageState.pending))
            session.add(DbMessage(id="plain", role="prompter", state="manual"))  # a string is accepted too
            await session.commit()
        async with sessions() as session:
            typed = await session.get(DbMessage, "typed")
            plain = await session.get(DbMessage, "plain")
            assert typed is not None and plain is not None
            assert (typed.role, typed.state) == (Role.assistant, MessageState.pending)
            assert type(plain.state) is MessageState and plain.role is Role.prompter
            pending = await session.exec(select(DbMessage.id).where(DbMessage.state == MessageState.pending))
            assert pending.all() == ["typed"]
            stored = await session.exec(text("SELECT role, state FROM message ORDER BY id"))  # type: ignore[call-overload]
            assert [tuple(row) for row in stored.all()] == [("prompter", "manual"), ("assistant", "pending")]
    finally:
        await engine.dispose()


async def test_a_message_kind_is_read_as_its_enum_and_stored_as_the_string_it_always_was(
    tmp_path: Path,
) -> None:
    settings = Settings(_env_file=None, database_url=f"sqlite+aiosqlite:///{tmp_path}/kinds.db")  # type: ignore[call-arg]
    engine = create_engine(settings)
    try:
        await upgrade_to_head(engine)
        sessions = make_session_factory(engine)
        async with sessions() as session:
            session.add(DbMessage(id="a", role=Role.assistant, state=MessageState.pending))  # chat by default
            session.add(DbMessage(id="b", kind=MessageKind.embedding, role=Role.assistant, state="pending"))
            await session.commit()
            # A row as an older version wrote it: the plain string.
            await session.exec(text("UPDATE message SET kind = 'response_deleted' WHERE id = 'a'"))  # type: ignore[call-overload]
            await session.commit()
        async with sessions() as session:
            a = await session.get(DbMessage, "a")
            b = await session.get(DbMessage, "b")
            assert a is not None and b is not None
            assert a.kind is MessageKind.response_deleted and b.kind is MessageKind.embedding
            assert f"{b.kind}" == "embedding" and b.kind == "embedding"  # logs and comparisons as before
            found = await session.exec(select(DbMessage.id).where(DbMessage.kind == MessageKind.embedding))
            assert found.all() == ["b"]
            stored = await session.exec(text("SELECT kind FROM message ORDER BY id"))  # type: ignore[call-overload]
            assert [row[0] for row in stored.all()] == ["response_deleted", "embedding"]
    finally:
        await engine.dispose()
