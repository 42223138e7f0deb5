"""The page's own modules, imported in the browser and given the cases the live stack does not
produce on demand: event streams split at awkward places, every status line an answer can show
(an estimated wait in `pending` events included), and branch selection in the message tree."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture
def page(open_page):
    web = open_page()
    web.goto()
    return web.page


def test_event_stream_parser_handles_any_chunking(page):
    events = page.evaluate(
        """async () => {
          const { parseEventStream } = await import('/static/js/events.js');
          const text = ': ping\\r\\n\\r\\nid: 1-0\\r\\ndata: {"event_type":"token","text":"a"}\\r\\n\\r\\n'
            + 'data: {"event_type":"pending","queue_position":1,"queue_size":2}\\n\\n'
            + 'id: 2-0\\rdata: {"event_type":"token",\\rdata: "text":"b"}\\r\\r';
          const results = [];
          for (const size of [1, 2, 3, 7, text.length]) {
            const bytes = new TextEncoder().encode(text);
            const body = new ReadableStream({
              start(controller) {
                for (let i = 0; i < bytes.length; i += size) controller.enqueue(bytes.slice(i, i + size));
                controller.close();
              },
            });
            const seen = [];
            for await (const event of parseEventStream(body)) seen.push(event);
            results.push(JSON.stringify(seen));
          }
          return results;
        }"""
    )
    assert len(set(events)) == 1, events
    assert events[0] == (
        '[{"id":"1-0","data":"{\\"event_type\\":\\"token\\",\\"text\\":\\"a\\"}"},'
        '{"id":null,"data":"{\\"event_type\\":\\"pending\\",\\"queue_position\\":1,\\"queue_size\\":2}"},'
        '{"id":"2-0","data":"{\\"event_type\\":\\"token\\",\\n\\"text\\":\\"b\\"}"}]'
    )


STATUS_CASES = [
    ({"state": "pending"}, None, "Waiting for a worker…"),
    (
        {"state": "pending"},
        {"pending": {"queue_position": 2, "queue_size": 5}},
        "Waiting in the queue: position 2 of 5",
    ),
    (
        {"state": "pending"},
        {"pending": {"queue_position": 2, "queue_size": 5, "estimated_wait_seconds": 41.6}},
        "Waiting in the queue: position 2 of 5 · about 42 s",
    ),
    (
        {"state": "pending"},
        {"pending": {"queue_position": 9, "queue_size": 9, "estimated_wait_seconds": 600}},
        "Waiting in the queue: position 9 of 9 · about 10 min",
    ),
    ({"state": "in_progress"}, {"text": ""}, "Writing…"),
    ({"state": "in_progress"}, {"text": "Hel"}, ""),
    (
        {"state": "in_progress"},
        {"retry": {"attempt": 2}},
        "The worker was lost: the answer restarts (attempt 2).",
    ),
    ({"state": "in_progress"}, {"connection": "reconnecting"}, "Connection lost. Reconnecting…"),
    ({"state": "cancelled"}, None, "Stopped."),
    (
        {"state": "complete", "generated_tokens": 12, "finish_reason": "length", "model_config_name": "m"},
        None,
        "12 tokens · stopped at the token limit · m",
    ),
    ({"state": "failed", "error": "no worker took it"}, None, "The answer failed: no worker took it"),
    ({"state": "timeout"}, None, "The answer took too long and was stopped."),
]


@pytest.mark.parametrize("message, stream, expected", STATUS_CASES)
def test_answer_status_lines(page, message, stream, expected):
    status = page.evaluate(
        """async ([message, stream]) => {
          const { answerStatus } = await import('/static/js/thread-view.js');
          return answerStatus(message, stream);
        }""",
        [message, stream],
    )
    assert status["text"] == expected
    assert bool(status.get("error")) == (message["state"] in ("failed", "timeout"))


def test_message_tree_threads_and_branches(page):
    result = page.evaluate(
        """async () => {
          const { MessageTree } = await import('/static/js/tree.js');
          const m = (id, parent, role, t) => ({ id, parent_id: parent, role, created_at: `2025-01-01T00:00:0${t}Z` });
          const tree = new MessageTree([
            m('p1', null, 'prompter', 0), m('a1', 'p1', 'assistant', 1), m('a2', 'p1', 'assistant', 2),
            m('p2', 'a1', 'prompter', 3), m('a3', 'p2', 'assistant', 4), m('p3', 'a1', 'prompter', 5),
          ]);
          const ids = (thread) => thread.map((x) => x.id).join(' ');
          const out = {};
          out.newest = ids(tree.thread(null));                 // no tail: the newest branch
          out.tail = ids(tree.thread('a3'));                   // a tail: its path
          out.siblings = tree.siblingsOf('p3').map((x) => x.id).join(' ');
          out.chooseA2 = tree.choose('a2');                    // a leaf
          out.chooseA1 = tree.choose('a1');                    // back: the branch last seen below a1
          tree.put(m('a4', 'p2', 'assistant', 6));             // another client added an answer
          out.extended = ids(tree.thread('p2'));               // a tail above a leaf: extended to it
          return out;
        }"""
    )
    assert result == {
        "newest": "p1 a2",
        "tail": "p1 a1 p2 a3",
        "siblings": "p2 p3",
        "chooseA2": "a2",
        "chooseA1": "a3",
        "extended": "p1 a1 p2 a3",
    }
