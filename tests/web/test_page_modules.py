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


# A signed-in page for the modules that call the API: an access token the page need not refresh
# (the routes below answer for the server, so it is never checked).
FAKE_SESSION = """() => {
  const claims = btoa(JSON.stringify({ exp: Math.floor(Date.now() / 1000) + 3600 }));
  localStorage.setItem('oasst.session', JSON.stringify({ access: `x.${claims}.y`, refresh: 'r' }));
}"""

# Sends a turn with followTurn and reports what came of it: the events in order, and how it ended.
FOLLOW_TURN = """async () => {
  const { followTurn } = await import('/static/js/events.js');
  const seen = [];
  let outcome = 'ended';
  try {
    await followTurn('/chats/t/turns', { content: 'hi' }, {
      signal: new AbortController().signal,
      onCreated: (event) => {
        seen.push(`created ${event.assistant_message.id}`);
        return `/chats/t/messages/${event.assistant_message.id}/events`;
      },
      onEvent: (event) => seen.push(`${event.event_type} ${event.text ?? ''}`.trim()),
      onConnection: (state) => seen.push(state),
    });
  } catch (error) {
    outcome = `${error.constructor.name} ${error.code ?? ''}`.trim();
  }
  return { seen, outcome };
}"""

CREATED = 'data: {"event_type":"created","prompter_message":{"id":"p"},"assistant_message":{"id":"a"}}\n\n'


def sse(status: int, body: str) -> dict:
    return {"status": status, "headers": {"Content-Type": "text/event-stream"}, "body": body}


def test_a_turn_broken_after_created_resumes_from_the_answers_events(page):
    page.evaluate(FAKE_SESSION)
    resumed_with = []
    page.route(
        "**/chats/t/turns",
        lambda route: route.fulfill(
            **sse(200, CREATED + 'id: 1-0\ndata: {"event_type":"token","text":"A"}\n\n')
        ),
    )

    def events(route):
        resumed_with.append(route.request.headers.get("last-event-id"))
        body = 'id: 2-0\ndata: {"event_type":"token","text":"B"}\n\n'
        route.fulfill(**sse(200, body + 'id: 3-0\ndata: {"event_type":"message","message":{"id":"a"}}\n\n'))

    page.route("**/chats/t/messages/a/events", events)
    result = page.evaluate(FOLLOW_TURN)
    assert result == {
        "seen": ["created a", "token A", "reconnecting", "open", "token B", "message"],
        "outcome": "ended",
    }
    assert resumed_with == ["1-0"]


def test_a_turn_broken_before_created_says_so_and_a_refused_one_rejects(open_page):
    web = open_page()
    web.goto()
    page = web.page
    page.evaluate(FAKE_SESSION)
    page.route("**/chats/t/turns", lambda route: route.fulfill(**sse(200, ": ping\n\n")))
    result = page.evaluate(FOLLOW_TURN)
    assert result == {"seen": ["reconnecting"], "outcome": "TurnInterrupted"}
    # A refusal is the API error, before any event.
    page.unroute("**/chats/t/turns")
    refusal = {"detail": "wait", "code": "too_many_concurrent_generations"}
    page.route("**/chats/t/turns", lambda route: route.fulfill(status=429, json=refusal))
    web.watch.allow("status 429", "/chats/t/turns")
    result = page.evaluate(FOLLOW_TURN)
    assert result == {"seen": [], "outcome": "ApiError too_many_concurrent_generations"}
