"""The flag store on Postgres: an answer's flag names the chat's owner and the chat, read from its message
when the hook does not know them; a request's flag keeps the user it was given."""

from __future__ import annotations

from oasst_inference_server.moderation.flags import FlagStore
from tests.support.api import API, start_chat

pytestmark = API


async def test_a_flag_on_an_answer_names_its_chat_and_the_chats_owner(app, client, user, live_model):
    chat = await start_chat(client, user, "Hello?", model=live_model)
    assert chat.assistant_id is not None
    flags = FlagStore(app.state.session_factory)
    assert await flags.user_of(chat.assistant_id) == user.id
    assert await flags.user_of("no-such-message") is None

    await flags.record(
        user_id=None,
        message_id=chat.assistant_id,
        chat_id=None,
        stage="answer",
        check="word_list",
        action="refuse",
        categories=["bad"],
        excerpt="x" * 1000,
    )
    stored = await flags.answer_flag(chat.assistant_id)
    assert stored is not None
    assert (stored.user_id, stored.chat_id, stored.categories) == (user.id, chat.chat_id, ["bad"])
    assert len(stored.excerpt) == 500

    await flags.record(
        user_id=user.id,
        message_id=None,
        chat_id=None,
        stage="request",
        check="word_list",
        action="flag",
        categories=["meh"],
        excerpt="meh",
    )
    (newest, *_) = await flags.page(10, None)
    assert (newest.user_id, newest.message_id, newest.stage) == (user.id, None, "request")
