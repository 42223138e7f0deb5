"""The per-user generation limits, counted in one query, on SQLite and on Postgres."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.admission.rate_limit import check_generation_limits
from oasst_inference_server.chats.accounts import delete_account
from oasst_inference_server.chats.chat_store import delete_chat
from oasst_inference_server.db.engine import create_engine, make_session_factory
from oasst_inference_server.db.migrations import upgrade_to_head
from oasst_inference_server.db.models import DbChat, DbMessage, DbUser, utcnow
from oasst_inference_server.domain_errors import InvalidRequest, RateLimited
from oasst_inference_server.settings import Settings
from tests.support.services import fresh_database


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def sessions(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite+aiosqlite:///{tmp_path}/limits.db"
        else:
            url = stack.enter_context(fresh_database("oasst_limits"))
        engine = create_engine(Settings(_env_file=None, database_url=url))  # type: ignore[call-arg]
        try:
            await upgrade_to_head(engine)
            yield make_session_factory(engine)
        finally:
            await engine.dispose()


def limits(per_minute: int = 0, running: int = 0) -> Settings:
    return Settings(  # type: ignore[call-arg]
        _env_file=None, rate_limit_per_minute=per_minute, max_concurrent_generations_per_user=running
    )


async def add_user(sessions: async_sessionmaker[AsyncSession]) -> tuple[str, str]:
    """A user and a chat of theirs: (user id, chat id)."""
    async with sessions() as session:
        user = DbUser(provider="debug", provider_account_id=uuid.uuid4().hex, display_name="u")
        session.add(user)
        await session.flush()
        chat = DbChat(user_id=user.id)
        session.add(chat)
        await session.commit()
        return user.id, chat.id


async def add_generation(
    sessions: async_sessionmaker[AsyncSession],
    *,
    state: str,
    minutes_ago: float = 0,
    chat_id: str | None = None,
    user_id: str | None = None,
) -> None:
    """A chat answer (``chat_id``) or an API request (``user_id``), enqueued ``minutes_ago``."""
    async with sessions() as session:
        session.add(
            DbMessage(
                chat_id=chat_id,
                user_id=user_id,
                role="assistant",
                state=state,
                model_config_name="m",
                kind="chat" if chat_id else "completion",  # an API request
                enqueued_at=utcnow() - timedelta(minutes=minutes_ago),
            )
        )
        await session.commit()


async def check(sessions: async_sessionmaker[AsyncSession], settings: Settings, user_id: str) -> None:
    async with sessions() as session:
        await check_generation_limits(session, settings, user_id)


async def test_running_generations_count_chat_answers_and_api_requests(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    user_id, chat_id = await add_user(sessions)
    other_id, other_chat = await add_user(sessions)
    await add_generation(sessions, state="in_progress", chat_id=chat_id, minutes_ago=5)
    await add_generation(sessions, state="pending", user_id=user_id, minutes_ago=5)
    await add_generation(sessions, state="complete", chat_id=chat_id, minutes_ago=5)  # finished: not running
    await add_generation(sessions, state="in_progress", chat_id=other_chat)  # someone else's
    await check(sessions, limits(running=3), user_id)
    with pytest.raises(RateLimited) as refused:
        await check(sessions, limits(running=2), user_id)
    assert refused.value.code == "too_many_concurrent_generations"
    assert refused.value.retry_after >= 1
    await check(sessions, limits(running=2), other_id)


async def test_the_rate_limit_counts_the_last_minute_and_says_when_the_next_fits(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    user_id, chat_id = await add_user(sessions)
    await add_generation(sessions, state="complete", chat_id=chat_id, minutes_ago=3)  # out of the window
    await add_generation(sessions, state="in_progress", chat_id=chat_id, minutes_ago=2)  # running, not recent
    await add_generation(sessions, state="complete", chat_id=chat_id, minutes_ago=0.5)
    await add_generation(sessions, state="failed", user_id=user_id, minutes_ago=0.25)
    await check(sessions, limits(per_minute=3), user_id)
    await add_generation(sessions, state="complete", user_id=user_id, minutes_ago=0.1)
    with pytest.raises(RateLimited) as refused:
        await check(sessions, limits(per_minute=3), user_id)
    assert refused.value.code == "rate_limited"
    # The oldest in the window (30 s ago) leaves it in about 30 s.
    assert 25 <= refused.value.retry_after <= 35
    await check(sessions, limits(per_minute=0, running=0), user_id)  # both off: never refused


async def test_a_request_counts_every_generation_it_starts(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """``count`` generations at once: admitted only if all of them fit, under both limits."""
    user_id, chat_id = await add_user(sessions)
    for _ in range(3):
        await add_generation(sessions, state="in_progress", chat_id=chat_id, minutes_ago=2)
    async with sessions() as session:
        await check_generation_limits(session, limits(running=5), user_id, count=2)  # 3 + 2 = 5
        with pytest.raises(RateLimited) as refused:
            await check_generation_limits(session, limits(running=5), user_id, count=3)
    assert refused.value.code == "too_many_concurrent_generations"
    assert "starts 3 more" in refused.value.detail
    # Per minute: four in the window, ten seconds apart; the oldest leaves it in about 20 s.
    other_id, other_chat = await add_user(sessions)
    for seconds_ago in (40, 30, 20, 10):
        await add_generation(sessions, state="complete", chat_id=other_chat, minutes_ago=seconds_ago / 60)
    async with sessions() as session:
        await check_generation_limits(session, limits(per_minute=6), other_id, count=2)
        with pytest.raises(RateLimited) as refused:
            await check_generation_limits(session, limits(per_minute=6), other_id, count=3)
    assert refused.value.code == "rate_limited"
    # Three more fit once one request has left the window: the oldest, 40 s ago.
    assert 15 <= refused.value.retry_after <= 25
    async with sessions() as session:
        with pytest.raises(RateLimited) as refused:
            await check_generation_limits(session, limits(per_minute=6), other_id, count=4)
    # Four more need two to leave: the second oldest, 30 s ago, leaves in about 30 s.
    assert 25 <= refused.value.retry_after <= 35


async def test_a_request_over_a_limit_by_itself_is_invalid_not_limited(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """No wait lets a request of more generations than a limit in: a 400 (naming ``n``), not a 429."""
    user_id, _ = await add_user(sessions)
    for settings in (limits(running=2), limits(per_minute=2)):
        async with sessions() as session:
            await check_generation_limits(session, settings, user_id, count=2)
            with pytest.raises(InvalidRequest) as refused:
                await check_generation_limits(session, settings, user_id, count=3)
        assert refused.value.code == "too_many_choices" and refused.value.param == "n"


async def test_deleting_the_chat_or_the_account_does_not_reset_the_rate_limit(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    user_id, chat_id = await add_user(sessions)
    for minutes_ago in (0.3, 0.2):
        await add_generation(sessions, state="complete", chat_id=chat_id, minutes_ago=minutes_ago)
    await add_generation(sessions, state="complete", user_id=user_id, minutes_ago=0.1)
    with pytest.raises(RateLimited):
        await check(sessions, limits(per_minute=3), user_id)
    async with sessions() as session:
        chat = await session.get(DbChat, chat_id)
        assert chat is not None
        await delete_chat(session, None, chat)  # type: ignore[arg-type]  # nothing to cancel
    with pytest.raises(RateLimited) as refused:
        await check(sessions, limits(per_minute=3), user_id)
    assert refused.value.code == "rate_limited"
    # The account goes too; the same person signing in again is a new user, and still limited.
    async with sessions() as session:
        user = await session.get(DbUser, user_id)
        assert user is not None
        identity = (user.provider, user.provider_account_id)
        await delete_account(session, None, user)  # type: ignore[arg-type]
        again = DbUser(provider=identity[0], provider_account_id=identity[1], display_name="again")
        session.add(again)
        await session.commit()
        again_id = again.id
    assert again_id != user_id
    with pytest.raises(RateLimited) as refused:
        await check(sessions, limits(per_minute=3), again_id)
    assert refused.value.code == "rate_limited"
    # Someone else is not affected by those records.
    other_id, _ = await add_user(sessions)
    await check(sessions, limits(per_minute=1), other_id)


@pytest.mark.postgres
async def test_a_burst_of_simultaneous_submissions_cannot_pass_the_concurrency_limit(tmp_path: Path) -> None:
    """Each submission counts, then inserts and commits: without the user's row lock, requests that count
    at the same moment all see room. Twelve at once against a limit of four: exactly four get in."""
    with fresh_database("oasst_limits_burst") as url:
        engine = create_engine(Settings(_env_file=None, database_url=url))  # type: ignore[call-arg]
        try:
            await upgrade_to_head(engine)
            sessions = make_session_factory(engine)
            user_id, chat_id = await add_user(sessions)
            settings = limits(running=4)
            counted = 0
            all_counted = asyncio.Event()

            def one_more_counted() -> None:
                nonlocal counted
                counted += 1
                if counted == 12:
                    all_counted.set()

            async def submit() -> bool:
                async with sessions() as session:
                    try:
                        await check_generation_limits(session, settings, user_id)
                    except RateLimited:
                        one_more_counted()
                        return False
                    one_more_counted()
                    # Hold the transaction until every other request has counted (or, locked out, for
                    # half a second): the widest window a race could use.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(0.5):
                            await all_counted.wait()
                    session.add(
                        DbMessage(
                            chat_id=chat_id,
                            role="assistant",
                            state="pending",
                            model_config_name="m",
                            kind="chat",
                            enqueued_at=utcnow(),
                        )
                    )
                    await session.commit()
                    return True

            admitted = await asyncio.gather(*(submit() for _ in range(12)))
            assert sum(admitted) == 4
            async with sessions() as session:
                assert (
                    len((await session.exec(select(DbMessage).where(DbMessage.chat_id == chat_id))).all())
                    == 4
                )
        finally:
            await engine.dispose()
