"""The admin CLI's alias commands write the database of the server's settings and tell the replicas
through the broker: a running server routes by the change at once; a refused change exits with its
error, and nothing is stored."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from oasst_inference_server import admin_cli
from tests.support.api import ADMIN, API, register_live_model, start_chat

pytestmark = API


async def run_cli(capsys: pytest.CaptureFixture[str], settings, *argv: str) -> str:
    # The CLI runs its own event loop (asyncio.run): in a thread, beside the session's.
    assert await asyncio.to_thread(admin_cli.main, list(argv), settings) == 0
    return capsys.readouterr().out


async def test_an_alias_set_with_the_cli_acts_on_a_running_server_at_once(
    app, client, settings, user, capsys
):
    model = await register_live_model(app)
    alias = f"cli-{uuid.uuid4().hex[:8]}"
    chat = await start_chat(client, user)
    # The server reads the aliases once before the change (its view must be refreshed by the broker).
    assert (await client.get("/admin/aliases", headers=ADMIN)).status_code == 200
    await client.post(
        f"/chats/{chat.chat_id}/assistant_message",
        json={"parent_id": chat.prompter_id, "model_config_name": "no-such-model"},
        headers=user.headers,
    )

    printed = json.loads(await run_cli(capsys, settings, "set-alias", alias, model))
    assert (printed["alias"], printed["model"], printed["source"]) == (alias, model, "api")
    answer = await client.post(
        f"/chats/{chat.chat_id}/assistant_message",
        json={"parent_id": chat.prompter_id, "model_config_name": alias},
        headers=user.headers,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["model_config_name"] == model

    listed = json.loads(await run_cli(capsys, settings, "list-aliases"))
    assert any(a["alias"] == alias for a in listed["aliases"])
    assert await run_cli(capsys, settings, "delete-alias", alias) == ""
    gone = await client.post(
        f"/chats/{chat.chat_id}/assistant_message",
        json={"parent_id": chat.prompter_id, "model_config_name": alias},
        headers=user.headers,
    )
    assert gone.status_code == 400 and gone.json()["code"] == "unknown_model"


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["set-alias", "bad name", "SmolLM2-135M-Instruct"], "invalid_alias_name"),
        (["set-alias", "ok-cli", "no-such-model"], "model_not_found"),
        (
            ["set-alias", "ok-cli", "SmolLM2-135M-Instruct", "--fallback", "SmolLM2-135M-Instruct"],
            "invalid_fallbacks",
        ),
        (["delete-alias", "never-set"], "alias_not_found"),
    ],
)
async def test_a_refused_change_exits_with_its_error(settings, argv, error):
    with pytest.raises(SystemExit) as caught:
        await asyncio.to_thread(admin_cli.main, argv, settings)
    assert error in str(caught.value)
