"""What a message costs its user in the fair queues, and who that user is.

A message gets a :class:`Ticket` when it is first queued (stored on the message, so a retry or the
recovery loop re-queues it at the same price): the user charged, the estimated tokens (prompt estimate
plus ``max_new_tokens``, each kind weighted by the settings) and the weight (the user's tier, doubled
per step of a trusted client's priority). The broker adds ``estimate / weight`` to the user's counter on
dispatch; when the worker reports the real counts the difference is charged (:func:`correction`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from pydantic import BaseModel, Field
from sqlalchemy import func
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.db.models import DbChat, DbMessage, DbUser, MessageKind
from oasst_inference_server.db.payloads import read_request
from oasst_inference_server.db.stored_json import stored_object
from oasst_inference_server.settings import Settings
from oasst_shared.schemas import MessageState, Role, SchedulingRequest

# Characters per token of the prompt estimate: the queue orders by it before any tokenizer saw the text.
CHARS_PER_TOKEN = 4


class Placement(NamedTuple):
    """What the dispatcher needs to place a job, carried by its queue hint so that placing it reads
    nothing from the database."""

    tokens: int  # prompt estimate plus max_new_tokens: the KV cache the job may need
    max_new_tokens: int  # sets the claim's generation deadline
    trusted_only: bool
    # The worker session that answered the conversation's previous turn, and the tokens its backend may
    # still hold of it: the job prefers that worker (:func:`.capacity.choose_worker`).
    affinity: str | None = None
    cached_tokens: int = 0

    def note(self) -> str:
        note = f"{self.tokens} {self.max_new_tokens} {int(self.trusted_only)}"
        return f"{note} {self.affinity} {self.cached_tokens}" if self.affinity else note

    @classmethod
    def parse(cls, note: str) -> Placement | None:
        """The placement of a hint's job note; None for a note of another form (or none)."""
        parts = note.split()
        numbers = parts[:3] + parts[4:]
        # isdecimal() alone admits other scripts' digits; the note is ASCII, written by note().
        if (
            len(parts) not in (3, 5)
            or not all(p.isascii() and p.isdecimal() for p in numbers)
            or parts[2] not in ("0", "1")
        ):
            return None
        placement = cls(int(parts[0]), int(parts[1]), parts[2] == "1")
        if len(parts) == 5 and parts[3].isascii() and len(parts[3]) <= _MAX_SESSION_ID:
            placement = placement._replace(affinity=parts[3], cached_tokens=int(parts[4]))
        return placement


_MAX_SESSION_ID = 64  # DbMessage.worker_session_id's length


class Ticket(BaseModel):
    user: str = Field(max_length=64)
    prompt_tokens: int = Field(ge=0)
    max_new_tokens: int = Field(ge=0)
    weight: float = Field(gt=0)
    priority: int = 0
    queue_timeout: float | None = None  # the request's own, if shorter than the setting
    # The user's tier is one of settings.trusted_workers_only_tiers: only trusted workers may answer.
    trusted_only: bool = False
    # The worker session that answered the previous turn, and the tokens of it its backend may hold.
    affinity: str | None = Field(default=None, max_length=_MAX_SESSION_ID, pattern=r"^\S+$")
    cached_tokens: int = Field(default=0, ge=0)
    # The user the message is for (a chat's owner for a chat message), whatever ``user`` the fair queue
    # uses: its usage limits are charged to them without reading the chat again. None in older tickets.
    owner: str | None = Field(default=None, max_length=64)

    def placement(self) -> Placement:
        return Placement(
            self.prompt_tokens + self.max_new_tokens,
            self.max_new_tokens,
            self.trusted_only,
            self.affinity,
            self.cached_tokens,
        )

    def timeout(self, settings: Settings) -> float:
        return min(settings.queue_timeout, self.queue_timeout or settings.queue_timeout)

    def tokens(self, settings: Settings, prompt_tokens: int, generated_tokens: int) -> float:
        return (
            prompt_tokens * settings.fair_queue_prompt_token_weight
            + generated_tokens * settings.fair_queue_generated_token_weight
        )

    def estimated_cost(self, settings: Settings) -> float:
        return self.tokens(settings, self.prompt_tokens, self.max_new_tokens) / self.weight

    def actual_cost(self, settings: Settings, prompt_tokens: int, generated_tokens: int) -> float:
        return self.tokens(settings, prompt_tokens, generated_tokens) / self.weight


def tier_weight(settings: Settings, tier: str | None) -> float:
    return settings.user_tiers.get(
        tier or settings.default_user_tier, settings.user_tiers[settings.default_user_tier]
    )


async def new_ticket(
    session: AsyncSession,
    settings: Settings,
    message: DbMessage,
    requested: SchedulingRequest | None = None,
    *,
    user: DbUser | None = None,
    chat_characters: int | None = None,
    known: Sequence[DbMessage] = (),
) -> Ticket:
    """The message's ticket. Routes pass the ``user`` they have (two queries fewer) and the length of
    the chat's messages if admission measured it (one fewer), and call this in the transaction that
    inserts the message, so queuing it costs no extra round trip. ``known``: messages the caller holds
    (the parent), which spare a read of the previous turn's worker (:func:`previous_turn_worker`)."""
    requested = requested or SchedulingRequest()
    if user is not None:
        user_id: str | None = user.id
        tier = user.tier
    else:
        user_id = message.user_id
        if user_id is None and message.chat_id is not None:
            user_id = (await session.exec(select(DbChat.user_id).where(DbChat.id == message.chat_id))).first()
        tier = None
        if user_id is not None:
            tier = (await session.exec(select(DbUser.tier).where(DbUser.id == user_id))).first()
    if message.kind == MessageKind.chat and message.chat_id is not None and chat_characters is not None:
        chars = chat_characters + len(message.system_prompt or "")
    elif message.kind == MessageKind.chat and message.chat_id is not None:
        chars = (
            await session.exec(
                select(func.coalesce(func.sum(func.length(DbMessage.content)), 0)).where(
                    DbMessage.chat_id == message.chat_id
                )
            )
        ).one()
        chars = int(chars) + len(message.system_prompt or "")
    else:
        payload = read_request(message.request_payload, what=f"message {message.id}")
        chars = payload.estimated_characters() if payload else 0
    stored_max = stored_object(message.sampling_parameters).get("max_new_tokens")
    # An estimate: a stored value of another type counts as none (the claim refuses such a message).
    max_new = stored_max if message.kind != MessageKind.embedding and type(stored_max) is int else 0
    bound = settings.max_request_priority
    priority = max(-bound, min(bound, requested.priority))
    affinity, cached = await previous_turn_worker(session, message, known) if settings.affinity else (None, 0)
    return Ticket(
        # One user for everyone turns the fair queue into one first-come-first-served list.
        user=(user_id or "") if settings.fair_queuing else "",
        prompt_tokens=chars // CHARS_PER_TOKEN,
        max_new_tokens=max_new,
        weight=tier_weight(settings, tier) * 2.0**priority,
        priority=priority,
        queue_timeout=requested.queue_timeout,
        trusted_only=(tier or settings.default_user_tier) in settings.trusted_workers_only_tiers,
        affinity=affinity,
        cached_tokens=cached,
        owner=user_id,
    )


async def previous_turn_worker(
    session: AsyncSession, message: DbMessage, known: Sequence[DbMessage] = ()
) -> tuple[str | None, int]:
    """The worker session that answered the conversation's previous turn (the assistant message the
    message's parent answers), and the tokens its backend may still hold of the conversation (that turn's
    prompt and answer): a follow-up sent to it finds them in its prefix cache. (None, 0) for a first
    turn, a request without a conversation, or a previous answer no worker completed."""
    if message.parent_id is None:
        return None, 0
    parent = next((m for m in known if m.id == message.parent_id), None)
    if parent is None:
        parent = await session.get(DbMessage, message.parent_id)
    if parent is None or parent.parent_id is None:
        return None, 0
    previous = await session.get(DbMessage, parent.parent_id)
    if (
        previous is None
        or previous.role != Role.assistant
        or previous.state != MessageState.complete
        or not previous.worker_session_id
    ):
        return None, 0
    return previous.worker_session_id, (previous.prompt_tokens or 0) + (previous.generated_tokens or 0)


def requested_options(message: DbMessage) -> SchedulingRequest:
    """The options a route stored on a message not queued yet (``scheduling`` without a ticket)."""
    try:
        return SchedulingRequest.model_validate(message.scheduling or {})
    except ValueError:
        return SchedulingRequest()


def stored_ticket(message: DbMessage) -> Ticket | None:
    return ticket_from(message.scheduling)


def ticket_owner(message: DbMessage) -> str | None:
    """The user the message's stored ticket names as its owner (None without one)."""
    ticket = stored_ticket(message)
    return ticket.owner if ticket is not None else None


def ticket_from(scheduling: dict[str, Any] | None) -> Ticket | None:
    """The ticket stored in a message's ``scheduling`` column, if it holds one."""
    if not scheduling or "user" not in scheduling:
        return None
    try:
        return Ticket.model_validate(scheduling)
    except ValueError:
        return None


def correction(settings: Settings, message: DbMessage) -> tuple[str, float] | None:
    """(user, amount) to charge once a message finished with real token counts; None if unknown."""
    ticket = stored_ticket(message)
    if ticket is None or message.generated_tokens is None:
        return None
    actual = ticket.actual_cost(
        settings, message.prompt_tokens or ticket.prompt_tokens, message.generated_tokens
    )
    return ticket.user, actual - ticket.estimated_cost(settings)
