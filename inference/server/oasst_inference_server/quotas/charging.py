"""Charging a finished generation to its key's and user's counters: the tokens its worker reported (prompt
plus completion) to the tokens-per-minute windows and the budgets of the period it was queued in, and
their price to the money budgets. Once per generation: the lifecycle charges a generation when its end is
stored, which happens once; a short-lived marker in the broker keeps a charge sent twice (a retried
script, two late reports at once) from counting twice (``periods.CHARGED_MARKER_SECONDS``)."""

from __future__ import annotations

from loguru import logger
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.broker import Broker, BrokerError
from oasst_inference_server.broker.counters import CounterAdd
from oasst_inference_server.db.models import DbChat, DbMessage, utcnow
from oasst_inference_server.quotas import periods
from oasst_inference_server.quotas.periods import MINUTE, PERIODS, SubjectKind
from oasst_inference_server.quotas.prices import Prices


class UsageCharger:
    def __init__(self, broker: Broker, prices: Prices, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._broker = broker
        self._prices = prices
        self._sessions = sessions

    async def charge(self, message: DbMessage, owner: str | None = None) -> bool:
        """Charge ``message``'s reported tokens; False if there was nothing to charge or it was charged
        before. A broker failure is logged: the budgets' counters are rebuilt from the database.
        ``owner``: the user it is for, where the caller knows (else a chat message's chat is read)."""
        prompt, completion = message.prompt_tokens or 0, message.generated_tokens or 0
        return await self._charge(message, prompt, completion, periods.charged_marker(message.id), owner)

    async def charge_late_prompt(self, message: DbMessage) -> bool:
        """Charge the prompt tokens of an answer that was stored, and charged, before its worker reported
        them (moderation cut it mid-stream), once."""
        marker = periods.charged_marker(f"prompt:{message.id}")
        return await self._charge(message, message.prompt_tokens or 0, 0, marker)

    async def _charge(
        self, message: DbMessage, prompt: int, completion: int, marker: str, owner: str | None = None
    ) -> bool:
        tokens = prompt + completion
        if tokens <= 0:
            return False
        user_id = message.user_id or owner or await self._chat_owner(message.chat_id)
        micro = self._prices.micro_usd(message.model_config_name, prompt, completion)
        queued = message.enqueued_at or utcnow()
        subjects: list[tuple[SubjectKind, str]] = [("user", user_id)] if user_id else []
        if message.api_key_id:
            subjects.append(("key", message.api_key_id))
        adds: list[CounterAdd] = []
        for kind, subject in subjects:
            adds.append(CounterAdd(periods.tokens_counter(kind, subject), tokens, window=MINUTE))
            for period in PERIODS:
                ttl = periods.counter_ttl(period, queued)
                adds.append(
                    CounterAdd(
                        periods.budget_tokens_counter(kind, subject, period, queued),
                        tokens,
                        ttl=ttl,
                        existing_only=True,
                    )
                )
                if micro:
                    adds.append(
                        CounterAdd(
                            periods.budget_usd_counter(kind, subject, period, queued),
                            micro,
                            ttl=ttl,
                            existing_only=True,
                        )
                    )
        try:
            return await self._broker.add_counters(adds, once=marker, once_ttl=periods.CHARGED_MARKER_SECONDS)
        except BrokerError as exc:
            logger.warning("usage of message {} not charged to its limits' counters: {}", message.id, exc)
            return False

    async def _chat_owner(self, chat_id: str | None) -> str | None:
        if chat_id is None:
            return None
        async with self._sessions() as session:
            chat = await session.get(DbChat, chat_id)
            return chat.user_id if chat is not None else None
