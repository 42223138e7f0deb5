"""The dataset export (``GET /admin/export`` and ``oasst-server admin export``): read back through a strict
reader of the original Open-Assistant format (tests/support/oasst_export.py), on Postgres."""

from __future__ import annotations

import gzip
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx

from oasst_inference_server.chats.export import ExportSelection, export_lines
from oasst_inference_server.chats.export.anonymizing import Anonymizer
from tests.support.admin_cli import admin_cli_bytes
from tests.support.api import ADMIN, API, User, answer, assert_error, finish_message, follow_up, start_chat
from tests.support.oasst_export import NODE_FIELDS, TREE_FIELDS, Node, Tree, check_tree, read_lines
from tests.support.sql_statements import recorded_statements

pytestmark = API


async def export(client: httpx.AsyncClient, **params: object) -> list[Tree]:
    response = await client.get("/admin/export", params=params, headers=ADMIN)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/x-ndjson"
    return read_lines(response.text)


async def of_user(client: httpx.AsyncClient, user: User, **params: object) -> dict[str, Tree]:
    """The user's exported trees by chat id."""
    return {t.message_tree_id: t for t in await export(client, user_id=user.id, **params)}


async def test_the_reader_knows_the_original_fields():
    assert set(Node.model_fields) == NODE_FIELDS and set(Tree.model_fields) == TREE_FIELDS


async def test_a_chat_exports_as_a_message_tree_with_its_votes_reports_and_evaluations(
    client, app, login, live_model
):
    user = await login()
    chat = await start_chat(client, user, "What is a tree?", model=live_model)
    assert chat.assistant_id is not None
    first, second = chat.assistant_id, await answer(client, user, chat.chat_id, chat.prompter_id, live_model)
    await finish_message(app, first, "A plant with a trunk.")
    await finish_message(app, second, "A graph without cycles.")
    headers = user.headers
    base = f"/chats/{chat.chat_id}/messages"
    assert (await client.post(f"{base}/{first}/votes", json={"score": 1}, headers=headers)).status_code == 204
    assert (
        await client.post(f"{base}/{second}/votes", json={"score": -1}, headers=headers)
    ).status_code == 204
    report = {"report_type": "offensive", "reason": "rude"}
    assert (await client.post(f"{base}/{second}/reports", json=report, headers=headers)).status_code == 204
    # The second answer preferred first, then (the latest word) the first one.
    evaluate = f"{base}/{{}}/message_evals"
    for better, worse in ((second, first), (first, second)):
        body = {"inferior_message_ids": [worse]}
        assert (await client.post(evaluate.format(better), json=body, headers=headers)).status_code == 204
    follow = await follow_up(client, user, chat.chat_id, first, "And a forest?")
    last = await answer(client, user, chat.chat_id, follow, live_model)
    await finish_message(app, last, "Many trees.")
    await answer(client, user, chat.chat_id, follow, live_model)  # still pending: not exported

    tree = (await of_user(client, user))[chat.chat_id]
    assert tree.tree_state == "not_applicable"
    nodes = check_tree(tree)
    assert set(nodes) == {chat.prompter_id, first, second, follow, last}
    prompt = tree.prompt
    assert prompt is not None and prompt.message_id == chat.prompter_id and prompt.text == "What is a tree?"
    # Replies in rank order: the latest evaluation preferred the first answer.
    assert [(r.message_id, r.rank) for r in prompt.replies or []] == [(first, 0), (second, 1)]
    for node in nodes.values():
        assert node.user_id == user.id and node.created_date is not None and node.deleted is False
        assert node.synthetic is (node.role == "assistant")
        assert node.model_name == (live_model if node.role == "assistant" else None)
    assert nodes[first].text == "A plant with a trunk." and nodes[first].emojis == {"+1": 1}
    assert nodes[second].emojis == {"-1": 1}
    assert [(e.type, e.score) for e in nodes[first].events["score"]] == [("score", 1)]
    reports = (nodes[second].events or {})["report"]
    assert [(r.user_id, r.report_type, r.reason) for r in reports] == [(user.id, "offensive", "rude")]
    rankings = (prompt.events or {})["ranking"]
    assert [(r.ranked_message_ids, r.ranking, r.ranking_parent_id, r.message_tree_id) for r in rankings] == [
        ([second, first], [0, 1], chat.prompter_id, chat.chat_id),
        ([first, second], [0, 1], chat.prompter_id, chat.chat_id),
    ]
    assert [r.message_id for r in nodes[first].replies or []] == [follow]
    assert [r.message_id for r in nodes[follow].replies or []] == [last] and nodes[last].replies == []
    # Unset fields are left out of the line, as the original writes them.
    raw = json.loads(tree.model_dump_json(exclude_none=True))
    assert "lang" not in raw["prompt"] and "labels" not in raw["prompt"]


async def test_only_chats_that_allow_data_use_are_exported(client, app, login, live_model):
    since = datetime.now(timezone.utc) - timedelta(seconds=1)
    sharing, private = await login(), await login()
    shared = await start_chat(client, sharing, "share this")
    kept_back = await start_chat(client, sharing, "not this one")
    secret = await start_chat(client, private, "my secret")
    for user, chat in ((sharing, kept_back), (private, secret)):
        changed = await client.put(
            f"/chats/{chat.chat_id}", json={"allow_data_use": False}, headers=user.headers
        )
        assert changed.status_code == 200, changed.text

    trees = {t.message_tree_id: t for t in await export(client, since=since.isoformat())}
    assert shared.chat_id in trees
    assert kept_back.chat_id not in trees and secret.chat_id not in trees
    assert not any(n.user_id == private.id for t in trees.values() for n in check_tree(t).values())
    # A chat that takes its consent back leaves the next export.
    await client.put(f"/chats/{shared.chat_id}", json={"allow_data_use": False}, headers=sharing.headers)
    assert await of_user(client, sharing) == {}


async def test_the_chats_a_deleted_account_kept_are_exported_only_when_asked(client, login):
    user = await login()
    kept = await start_chat(client, user, "for research")
    assert (await of_user(client, user)).keys() == {kept.chat_id}
    assert (await client.delete("/account", headers=user.headers)).status_code == 204
    assert await of_user(client, user) == {}
    tree = (await of_user(client, user, include_deleted=True))[kept.chat_id]
    assert all(n.deleted is True for n in check_tree(tree).values())


async def test_an_export_window_and_bad_parameters(client, login):
    user = await login()
    chat = await start_chat(client, user)
    now = datetime.now(timezone.utc)
    assert (await of_user(client, user, since=(now - timedelta(hours=1)).isoformat())).keys() == {
        chat.chat_id
    }
    assert await of_user(client, user, until=(now - timedelta(hours=1)).isoformat()) == {}
    assert await of_user(client, user, since=(now + timedelta(hours=1)).isoformat()) == {}
    # A moment without a zone is UTC.
    naive = (now - timedelta(hours=1)).replace(tzinfo=None).isoformat()
    assert (await of_user(client, user, since=naive)).keys() == {chat.chat_id}
    bad = await client.get(
        "/admin/export", params={"since": now.isoformat(), "until": now.isoformat()}, headers=ADMIN
    )
    assert_error(bad, 422, "invalid_window")
    assert_error(await client.get("/admin/export", params={"since": "yesterday"}, headers=ADMIN), 422)
    assert_error(await client.get("/admin/export", params={"user_id": "x" * 37}, headers=ADMIN), 422)
    assert_error(await client.get("/admin/export"), 401)
    assert_error(await client.get("/admin/export", headers=user.headers), 403)


async def test_a_big_export_is_read_a_batch_at_a_time_as_it_streams(client, app, login):
    user = await login()
    chats = {(await start_chat(client, user, f"prompt {i}")).chat_id for i in range(11)}
    lines = export_lines(app.state.session_factory, ExportSelection(user_id=user.id), batch_size=4)
    with recorded_statements(app) as statements:
        first = await anext(lines)

        def chat_pages() -> int:
            return sum(1 for s in statements if s.startswith("SELECT chat.") and "LIMIT" in s)

        # The first tree comes out after one batch (one page of chats and its messages and feedback).
        assert chat_pages() == 1 and len(statements) == 4
        rest = [line async for line in lines]
        assert chat_pages() == 3  # 4 + 4 + 3 chats
    trees = read_lines(first + "".join(rest))
    assert {t.message_tree_id for t in trees} == chats
    assert sorted(t.message_tree_id for t in trees) == [t.message_tree_id for t in trees]  # by chat id
    # The route streams the same lines.
    assert (await of_user(client, user)).keys() == chats


async def test_an_anonymized_export_hashes_every_id_and_keeps_the_tree(client, app, login, live_model):
    user = await login()
    chat = await start_chat(client, user, "Anonymous?", model=live_model)
    assert chat.assistant_id is not None
    other = await answer(client, user, chat.chat_id, chat.prompter_id, live_model)
    for message_id in (chat.assistant_id, other):
        await finish_message(app, message_id)
    body = {"inferior_message_ids": [other]}
    evaluated = await client.post(
        f"/chats/{chat.chat_id}/messages/{chat.assistant_id}/message_evals", json=body, headers=user.headers
    )
    assert evaluated.status_code == 204
    report = {"report_type": "spam", "reason": ""}
    url = f"/chats/{chat.chat_id}/messages/{other}/reports"
    assert (await client.post(url, json=report, headers=user.headers)).status_code == 204

    async def exported(seed: str) -> str:
        lines = export_lines(
            app.state.session_factory, ExportSelection(user_id=user.id), anonymizer=Anonymizer(seed)
        )
        return "".join([line async for line in lines])

    text = await exported("a seed of sixteen chars")
    for raw_id in (user.id, chat.chat_id, chat.prompter_id, chat.assistant_id, other):
        assert raw_id not in text
    (tree,) = read_lines(text)
    nodes = check_tree(tree)  # replies still nest under their (hashed) parents
    assert len(nodes) == 3 and len({n.user_id for n in nodes.values()}) == 1
    assert tree.prompt is not None
    (ranking,) = (tree.prompt.events or {})["ranking"]
    assert ranking.ranked_message_ids == [r.message_id for r in tree.prompt.replies or []]
    assert ranking.ranking_parent_id == tree.prompt.message_id and ranking.user_id == tree.prompt.user_id
    assert ranking.message_tree_id == tree.message_tree_id
    reported = nodes[ranking.ranked_message_ids[1]]
    assert [e.user_id for e in (reported.events or {})["report"]] == [tree.prompt.user_id]
    assert await exported("a seed of sixteen chars") == text  # the same seed, the same hashes
    assert read_lines(await exported("another seed, as long"))[0].message_tree_id != tree.message_tree_id


async def test_the_admin_cli_writes_the_export_to_a_file_or_standard_output(
    client, app, login, settings, tmp_path
):
    user = await login()
    chat = await start_chat(client, user, "from the command line")
    path: Path = tmp_path / "export.jsonl.gz"
    made = admin_cli_bytes(
        settings, "export", "--output", str(path), "--user-id", user.id, "--batch-size", "1"
    )
    assert made.returncode == 0, made.stderr
    assert b"exported 1 message trees" in made.stderr
    (tree,) = read_lines(gzip.decompress(path.read_bytes()).decode())
    assert tree.message_tree_id == chat.chat_id and check_tree(tree)
    assert list(tmp_path.iterdir()) == [path]  # no partial file left
    printed = admin_cli_bytes(settings, "export", "--user-id", user.id)
    assert printed.returncode == 0, printed.stderr
    assert [t.message_tree_id for t in read_lines(printed.stdout.decode())] == [chat.chat_id]
    zipped = admin_cli_bytes(settings, "export", "--user-id", user.id, "--gzip")
    assert [t.message_tree_id for t in read_lines(gzip.decompress(zipped.stdout).decode())] == [chat.chat_id]
    hashed = admin_cli_bytes(
        settings, "export", "--user-id", user.id, "--anonymizer-seed", "0123456789abcdef"
    )
    assert hashed.returncode == 0 and chat.chat_id.encode() not in hashed.stdout
    assert len(read_lines(hashed.stdout.decode())) == 1
    short = admin_cli_bytes(settings, "export", "--anonymizer-seed", "short")
    assert short.returncode == 2 and b"at least 16 characters" in short.stderr
    window = admin_cli_bytes(settings, "export", "--since", "2025-01-02", "--until", "2025-01-01")
    assert window.returncode == 2 and b"since must be before until" in window.stderr
