// An answer's server-sent events, read over fetch (EventSource cannot send the Authorization header).
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

/**
 * Follow the events at ``path`` until the terminal one, calling ``onEvent`` with each parsed event
 * and ``onConnection("reconnecting", attempt)`` / ``onConnection("open")`` as the connection comes
 * and goes. Resolves when the answer ended or ``signal`` aborted; rejects on a final API error.
 */
export async function followEvents(path, { signal, onEvent, onConnection = () => {} }) {
  let lastEventId = null;
  let failures = 0;
  let ended = false;
  while (!signal.aborted) {
    try {
      const headers = { Accept: "text/event-stream" };
      if (lastEventId !== null) headers["Last-Event-ID"] = lastEventId;
      const response = await request(path, { headers, signal, raw: true });
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
