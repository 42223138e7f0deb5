// Drawing the thread: prompts as text, answers as Markdown, and under each message its controls
// (sibling arrows, edit, copy, regenerate, votes, report). The controller (chat.js) owns the state;
// this module only turns it into elements and reports clicks through the ``actions`` callbacks.

import { $, h } from "./dom.js";
import { describeError } from "./errors.js";
import { icon } from "./icons.js";
import { renderInto } from "./markdown.js";
import { ACTIVE_STATES } from "./tree.js";

const FAILED_TEXT = {
  failed: "The answer failed",
  refused: "The model refused this request as invalid",
  timeout: "The answer took too long and was stopped",
  aborted_by_worker: "The worker gave up on this answer",
};

function formatWait(seconds) {
  if (seconds < 60) return `about ${Math.max(1, Math.round(seconds))} s`;
  return `about ${Math.round(seconds / 60)} min`;
}

/** The line under an answer: where it is in the queue, how it ended, or what went wrong. */
export function answerStatus(message, stream) {
  if (stream?.connection === "reconnecting") return { text: "Connection lost. Reconnecting…" };
  if (stream?.error) return { text: describeError(stream.error), error: true };
  if (stream?.retry) return { text: `The worker was lost: the answer restarts (attempt ${stream.retry.attempt}).` };
  if (message.state === "pending") {
    const pending = stream?.pending;
    if (!pending) return { text: "Waiting for a worker…" };
    let text = `Waiting in the queue: position ${pending.queue_position} of ${pending.queue_size}`;
    if (typeof pending.estimated_wait_seconds === "number") text += ` · ${formatWait(pending.estimated_wait_seconds)}`;
    return { text };
  }
  if (message.state === "in_progress") return { text: stream?.text ? "" : "Writing…" };
  if (message.state === "cancelled") return { text: "Stopped." };
  if (message.state === "complete") {
    const parts = [];
    if (message.generated_tokens) parts.push(`${message.generated_tokens} tokens`);
    if (message.finish_reason === "length") parts.push("stopped at the token limit");
    if (message.model_config_name) parts.push(message.model_config_name);
    return { text: parts.join(" · ") };
  }
  const reason = FAILED_TEXT[message.state] || "The answer failed";
  return { text: message.error ? `${reason}: ${message.error}` : `${reason}.`, error: true };
}

export class ThreadView {
  constructor(actions) {
    this.actions = actions;
    this.list = $("thread");
    this.scroller = $("messages");
    this.editing = null; // the id of the prompt being edited
  }

  nearBottom() {
    const s = this.scroller;
    return s.scrollHeight - s.scrollTop - s.clientHeight < 120;
  }

  scrollToBottom() {
    this.scroller.scrollTop = this.scroller.scrollHeight;
  }

  /** Draw the whole thread (after a structural change), keeping the focused control focused. */
  render({ tree, thread, streams, answerErrors }) {
    const focusKey = document.activeElement?.dataset?.focusKey;
    const stick = this.nearBottom();
    $("empty-chat").hidden = thread.length > 0;
    const items = thread.map((message) =>
      message.role === "prompter" ? this.prompt(message, tree) : this.answer(message, tree, streams.get(message.id)),
    );
    const last = thread.at(-1);
    const failed = last?.role === "prompter" && (last.refusal || answerErrors.get(last.id));
    if (failed) items.push(this.answerError(last, failed));
    this.list.replaceChildren(...items);
    if (focusKey) this.list.querySelector(`[data-focus-key="${CSS.escape(focusKey)}"]`)?.focus();
    if (stick) this.scrollToBottom();
  }

  /** Redraw one answer's text and status while it streams (cheap: no other message is touched). */
  updateAnswer(message, stream) {
    const item = this.list.querySelector(`li[data-id="${CSS.escape(message.id)}"]`);
    if (!item) return;
    const stick = this.nearBottom();
    const body = item.querySelector(".msg-body");
    const active = ACTIVE_STATES.has(message.state);
    renderInto(body, active ? stream?.text || "" : message.content || stream?.text || "", { final: !active });
    body.classList.toggle("typing", active && message.state === "in_progress");
    this.setStatus(item.querySelector(".msg-status"), answerStatus(message, stream));
    if (stick) this.scrollToBottom();
  }

  setStatus(el, { text, error = false }) {
    el.textContent = text;
    el.classList.toggle("error", error);
  }

  siblingNav(message, tree) {
    const siblings = tree.siblingsOf(message.id);
    if (siblings.length < 2) return null;
    const index = siblings.findIndex((m) => m.id === message.id);
    const what = message.role === "prompter" ? "version of this message" : "answer";
    const go = (offset, name, label) =>
      h("button", {
        type: "button",
        className: "ghost",
        "aria-label": `${label} ${what}`,
        title: `${label} ${what}`,
        disabled: !siblings[index + offset],
        dataset: { focusKey: `${message.parent_id || "root"}:${name}` },
        onclick: () => this.actions.switchTo(siblings[index + offset].id),
      }, icon(name));
    return h(
      "span",
      { className: "sibling-nav" },
      go(-1, "left", "Previous"),
      h("span", { "aria-label": `${what} ${index + 1} of ${siblings.length}` }, `${index + 1} / ${siblings.length}`),
      go(1, "right", "Next"),
    );
  }

  button(name, label, onclick, extra = {}) {
    return h("button", { type: "button", className: "ghost", "aria-label": label, title: label, onclick, ...extra }, icon(name));
  }

  prompt(message, tree) {
    if (this.editing === message.id) return this.editor(message);
    return h(
      "li",
      { className: "msg prompter", dataset: { id: message.id }, "aria-label": message.unsent ? "Your message, not sent" : "Your message" },
      h("div", { className: "msg-body" }, message.content),
      h(
        "div",
        { className: "msg-actions" },
        this.siblingNav(message, tree),
        this.button("pencil", "Edit message", () => this.startEdit(message.id), { dataset: { focusKey: `${message.id}:edit` } }),
      ),
    );
  }

  /** Where the answer to the last prompt would be, when asking for it failed (or the server refused
   * the whole turn, and the prompt is not stored): why, and a retry. */
  answerError(prompt, { error, model }) {
    return h(
      "li",
      { className: "msg assistant", "aria-label": "No answer" },
      h(
        "div",
        { className: "answer-error" },
        h("p", { role: "alert" }, describeError(error, { model })),
        h("button", { type: "button", className: "secondary small", onclick: () => this.actions.retryAnswer(prompt) }, "Try again"),
      ),
    );
  }

  startEdit(id) {
    this.editing = id;
    this.actions.redraw();
    this.list.querySelector(".edit-box textarea")?.focus();
  }

  editor(message) {
    const area = h("textarea", { "aria-label": "Edit your message", maxlength: 16000 });
    area.value = message.content;
    const first = !message.parent_id && !message.unsent; // a refused prompt is replaced in its place
    const cancel = () => {
      this.editing = null;
      this.actions.redraw();
    };
    const save = () => {
      const text = area.value.trim();
      if (!text) return;
      this.editing = null;
      this.actions.edit(message, text);
    };
    area.addEventListener("keydown", (event) => {
      if (event.key === "Escape") cancel();
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        save();
      }
    });
    return h(
      "li",
      { className: "msg prompter editing", dataset: { id: message.id } },
      h(
        "div",
        { className: "msg-body edit-box" },
        area,
        first ? h("p", { className: "hint" }, "The first message of a chat has no siblings: saving starts a new chat.") : null,
        h(
          "div",
          { className: "row" },
          h("button", { type: "button", className: "secondary", onclick: cancel }, "Cancel"),
          h("button", { type: "button", className: "primary", onclick: save }, first ? "Save as new chat" : "Save and send"),
        ),
      ),
    );
  }

  answer(message, tree, stream) {
    const active = ACTIVE_STATES.has(message.state);
    const body = h("div", { className: "msg-body markdown" });
    const status = h("span", { className: "msg-status" });
    const actions = h("div", { className: "msg-actions" }, this.siblingNav(message, tree));
    if (!active) {
      const score = message.score || 0;
      const reported = (message.reports || []).length > 0;
      actions.append(
        message.content ? this.button("copy", "Copy answer", () => this.actions.copy(message)) : null,
        this.button("regenerate", "Regenerate answer", () => this.actions.regenerate(message), {
          dataset: { focusKey: `${message.parent_id}:regenerate` },
        }),
        ...(message.state === "complete"
          ? [
              this.button("thumbUp", "Good answer", () => this.actions.vote(message, score === 1 ? 0 : 1), {
                "aria-pressed": String(score === 1),
                dataset: { focusKey: `${message.id}:up` },
              }),
              this.button("thumbDown", "Bad answer", () => this.actions.vote(message, score === -1 ? 0 : -1), {
                "aria-pressed": String(score === -1),
                dataset: { focusKey: `${message.id}:down` },
              }),
              this.button("flag", reported ? "Reported" : "Report answer", () => this.actions.report(message), {
                "aria-pressed": String(reported),
                disabled: reported,
              }),
            ]
          : []),
      );
    }
    actions.append(status);
    const item = h(
      "li",
      { className: "msg assistant", dataset: { id: message.id }, "aria-label": "Answer", "aria-busy": String(active) },
      body,
      actions,
    );
    renderInto(body, active ? stream?.text || "" : message.content || "", { final: !active });
    body.classList.toggle("typing", message.state === "in_progress");
    this.setStatus(status, answerStatus(message, stream));
    return item;
  }
}
