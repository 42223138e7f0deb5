// An answer's server-sent events, read over fetch (EventSource cannot send the Authorization header,
// nor read the response of a POST such as the one that sends a turn).
//
// Events are `pending`, `token` and `retry`, then exactly one `message` or `error`. Every stored
// event has an id; when the connection drops, the stream is resumed with Last-Event-ID, so the
// server sends only what came after the last event seen: nothing twice, nothing lost.

import { request } from "./api.js";
import { ApiError, NetworkError } from "./errors.js";
import { sleep } from "./dom.js";

const TERMINAL = new Set(["message", "error"]);
const MAX_BACKOFF_MS = 10_000;

/** Parse an SSE byte stream into {id, data} events (the WHATWG rules for the fields we use). */
export async function* parseEventStream(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let id = null;
  let data = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done && !buffer.endsWith("\r")) return;
      buffer += done ? "\n" : value; // at the end, a CR held back below did end its line
      // A CR at the very end may be the first half of a CRLF split between two chunks: hold it.
      const cut = buffer.endsWith("\r") ? buffer.length - 1 : buffer.length;
      const lines = buffer.slice(0, cut).split(/\r\n|\r|\n/);
      buffer = lines.pop() + buffer.slice(cut); // an incomplete last line waits for more bytes
      for (const line of lines) {
        if (line === "") {
          if (data.length || id !== null) yield { id, data: data.join("\n") };
          id = null;
          data = [];
          continue;
        }
        if (line.startsWith(":")) continue; // a comment: the server's keep-alive ping
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "data") data.push(text);
        else if (field === "id") id = text;
      }
      if (done) return;
    }
  } finally {
    reader.releaseLock();
  }
}

function retryable(error) {
  if (error instanceof NetworkError || error instanceof TypeError) return true; // dropped or offline
  return error instanceof ApiError && (error.status >= 502 || error.status === 500); // restarting server
}

function nextOnline(signal, ms) {
  // Wake up early when the browser says the network is back.
  const controller = new AbortController();
  const wake = () => controller.abort();
  window.addEventListener("online", wake, { once: true });
  signal.addEventListener("abort", wake, { once: true });
  return sleep(ms, controller.signal).finally(() => window.removeEventListener("online", wake));
}

/** The turn's stream broke before its `created` event: whether the turn was created is unknown. */
export class TurnInterrupted extends Error {}

/**
 * Read events until the terminal one, reconnecting as needed. ``connect(lastEventId)`` opens one
 * connection (a Response); ``onEvent`` gets each parsed event, ``onConnection("reconnecting",
 * attempt)`` / ``onConnection("open")`` how the connection comes and goes.
 */
async function follow(connect, { signal, onEvent, onConnection = () => {} }) {
  let lastEventId = null;
  let failures = 0;
  let ended = false;
  while (!signal.aborted) {
    try {
      const response = await connect(lastEventId);
      if (failures) onConnection("open");
      failures = 0;
      for await (const event of parseEventStream(response.body)) {
        // After the terminal event the server closes the stream: read on to its end, so the
        // request completes rather than being left open (and aborted when the page goes).
        if (ended) continue;
        if (event.id) lastEventId = event.id;
        if (!event.data) continue;
        const parsed = JSON.parse(event.data);
        onEvent(parsed);
        ended = TERMINAL.has(parsed.event_type);
      }
      if (ended) return;
      // The stream closed without its terminal event (a proxy timeout, a server restart): resume.
    } catch (error) {
      if (signal.aborted || ended) return;
      if (!retryable(error)) throw error;
    }
    failures += 1;
    onConnection("reconnecting", failures);
    await nextOnline(signal, Math.min(MAX_BACKOFF_MS, 500 * 2 ** (failures - 1)));
  }
}

function eventsRequest(path, lastEventId, signal) {
  const headers = { Accept: "text/event-stream" };
  if (lastEventId !== null) headers["Last-Event-ID"] = lastEventId;
  return request(path, { headers, signal, raw: true });
}

/**
 * Follow the events at ``path`` until the terminal one (see ``follow``). Resolves when the answer
 * ended or ``signal`` aborted; rejects on a final API error.
 */
export function followEvents(path, { signal, onEvent, onConnection }) {
  return follow((lastEventId) => eventsRequest(path, lastEventId, signal), { signal, onEvent, onConnection });
}

/**
 * Send a whole turn (``POST /chats/{id}/turns``: the prompt and its answer, created together) and
 * follow the answer. A refusal rejects before anything was created, as the API error. The stream's
 * first event, `created`, goes to ``onCreated``, which returns the path of the answer's events: a
 * broken stream is resumed there with Last-Event-ID, as ``followEvents`` does. A stream broken
 * before `created` rejects with ``TurnInterrupted``.
 */
export async function followTurn(path, body, { signal, onCreated, onEvent, onConnection }) {
  const headers = { Accept: "text/event-stream" };
  let response = await request(path, { method: "POST", body, headers, signal, raw: true });
  let eventsPath = null;
  const connect = (lastEventId) => {
    if (response) {
      const first = response;
      response = null;
      return first;
    }
    if (eventsPath === null) throw new TurnInterrupted("the turn's stream broke before it said what it created");
    return eventsRequest(eventsPath, lastEventId, signal);
  };
  const route = (event) => {
    if (event.event_type === "created") eventsPath = onCreated(event);
    else onEvent(event);
  };
  await follow(connect, { signal, onEvent: route, onConnection });
}
