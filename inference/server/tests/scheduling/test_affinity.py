"""Affinity on the real Postgres and Redis: a conversation's next turn is queued naming the worker session
that answered its previous turn and the tokens its backend may hold of it (its ticket and its queue
hint), so the dispatcher can prefer that worker; a first turn names none. The worker's count of cached
prompt tokens is stored, bounded by the prompt, and shown with the message."""

from __future__ import annotations

from oasst_inference_server.events import work_queue_name
from oasst_inference_server.scheduling import fair_share
from oasst_shared.protocol import GeneratedText
from tests.support.api import API, answer, follow_up, start_chat

pytestmark = API


def done(message_id: str, *, prompt_tokens: int, cached_tokens: int | None) -> GeneratedText:
    return GeneratedText(
        message_id=message_id,
        text="Hello!",
        finish_reason="eos_token",
        generated_tokens=3,
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
    )


async def test_a_follow_up_is_queued_for_the_worker_of_the_previous_turn(client, app, user, live_model):
    lifecycle = app.state.lifecycle
    conversation = await start_chat(client, user, model=live_model)
    first = conversation.assistant_id
    assert fair_share.stored_ticket(await lifecycle.get(first)).affinity is None  # a first turn
    assert await lifecycle.claim(first, "ws-first") is not None
    assert await lifecycle.complete("ws-first", done(first, prompt_tokens=20, cached_tokens=0))

    prompter = await follow_up(client, user, conversation.chat_id, first, "And then?")
    second = await answer(client, user, conversation.chat_id, prompter, live_model)
    ticket = fair_share.stored_ticket(await lifecycle.get(second))
    assert ticket is not None and ticket.affinity == "ws-first" and ticket.cached_tokens == 23
    # The queue hint carries it: placing the job reads nothing.
    popped = [await app.state.broker.pop_hint(work_queue_name(live_model), timeout=1.0) for _ in range(2)]
    placements = {hint.message_id: fair_share.Placement.parse(hint.job) for hint in popped if hint}
    assert placements[second] == ticket.placement() and placements[second].affinity == "ws-first"

    # A claim that is answered with more cached tokens than the prompt stores the prompt's count.
    assert await lifecycle.claim(second, "ws-second") is not None
    assert await lifecycle.complete("ws-second", done(second, prompt_tokens=30, cached_tokens=10_000))
    message = (
        await client.get(f"/chats/{conversation.chat_id}/messages/{second}", headers=user.headers)
    ).json()
    assert message["cached_tokens"] == 30 and message["prompt_tokens"] == 30


async def test_without_affinity_no_worker_is_named(client, app, user, live_model):
    lifecycle = app.state.lifecycle
    conversation = await start_chat(client, user, model=live_model)
    first = conversation.assistant_id
    assert await lifecycle.claim(first, "ws-first") is not None
    assert await lifecycle.complete("ws-first", done(first, prompt_tokens=20, cached_tokens=None))
    app.state.settings.affinity = False
    try:
        prompter = await follow_up(client, user, conversation.chat_id, first, "And then?")
        second = await answer(client, user, conversation.chat_id, prompter, live_model)
    finally:
        app.state.settings.affinity = True
    assert fair_share.stored_ticket(await lifecycle.get(second)).affinity is None
    assert (await lifecycle.get(first)).cached_tokens is None  # the worker did not tell
    await lifecycle.fail(second, "test over")
