// One open chat: its message tree from the server, the thread shown, the answers being streamed, and
// the actions on it (send, stop, regenerate, edit, switch branch, vote, report).
//
// The server is the truth: the chat, its tree and the branch shown (active_thread_tail_message_id)
// are read from it when a chat opens, so a reload shows exactly what was there. Only the answers
// being written live in the page, as their event streams.

import { api } from "./api.js";
import { chatTitle } from "./chat-list.js";
import { $, copyText, toast } from "./dom.js";
import { describeError } from "./errors.js";
import { followEvents } from "./events.js";
import { ThreadView } from "./thread-view.js";
import { ACTIVE_STATES, MessageTree, REPLYABLE_STATES } from "./tree.js";

export class ChatController {
  constructor({ preferences, chatList, onChatChanged }) {
    this.preferences = preferences;
    this.chatList = chatList;
    this.onChatChanged = onChatChanged; // (chat or null) the open chat or its title changed
    this.view = new ThreadView({
      switchTo: (id) => this.switchTo(id),
      edit: (message, text) => this.edit(message, text),
      regenerate: (message) => this.requestAnswer(message.parent_id),
      retryAnswer: (prompt) => this.requestAnswer(prompt.id),
      vote: (message, score) => this.vote(message, score),
      report: (message) => this.report(message),
      copy: (message) =>
        copyText(message.content).then(
          () => toast("Answer copied."),
          () => toast("The answer could not be copied (the browser refused).", { error: true }),
        ),
      redraw: () => this.render(),
    });
    this.reset(null);
  }

  /** Show ``chat`` (null: a new chat). Its system prompt is the newest one its thread was answered
   * with, unless ``systemPrompt`` carries one over (a new chat keeps what the user set for it). */
  reset(chat, systemPrompt = null) {
    for (const stream of this.streams?.values() || []) stream.controller.abort();
    this.chat = chat;
    this.tree = new MessageTree(chat?.messages || []);
    this.tail = chat?.active_thread_tail_message_id || null;
    this.streams = new Map(); // answer id -> {controller, text, pending, retry, connection, error}
    this.answerErrors = new Map(); // prompt id -> {error, model}: asking for its answer failed
    this.drawQueued = new Set();
    this.view.editing = null;
    const thread = this.thread();
    const configured = [...thread].reverse().find((m) => m.role === "assistant" && m.system_prompt);
    this.systemPrompt = systemPrompt ?? configured?.system_prompt ?? "";
  }

  thread() {
    return this.tree.thread(this.tail);
  }

  /** The answer being written at the end of the thread, if any. */
  activeAnswer() {
    const last = this.thread().at(-1);
    return last && last.role === "assistant" && ACTIVE_STATES.has(last.state) ? last : null;
  }

  newChat(systemPrompt = null) {
    this.reset(null, systemPrompt);
    this.render();
    this.onChatChanged(null);
  }

  async open(chatId) {
    const chat = await api.get(`/chats/${encodeURIComponent(chatId)}`);
    this.reset(chat);
    this.render();
    this.onChatChanged(chat);
    this.view.scrollToBottom();
    this.followActive();
  }

  render() {
    this.view.render({ tree: this.tree, thread: this.thread(), streams: this.streams, answerErrors: this.answerErrors });
    this.updateComposer();
  }

  updateComposer() {
    const active = Boolean(this.activeAnswer());
    $("send").hidden = active;
    $("stop").hidden = !active;
    if (!active) $("stop").disabled = false;
    $("messages").setAttribute("aria-busy", String(active));
  }

  /** Follow every answer of the shown thread that is still being written. */
  followActive() {
    for (const message of this.thread()) {
      if (message.role === "assistant" && ACTIVE_STATES.has(message.state)) this.follow(message.id);
    }
  }

  follow(messageId) {
    if (this.streams.has(messageId)) return;
    const chatId = this.chat.id;
    const stream = { controller: new AbortController(), text: "", pending: null, retry: null, connection: "open", error: null };
    this.streams.set(messageId, stream);
    const redraw = () => this.queueDraw(messageId);
    followEvents(`/chats/${chatId}/messages/${messageId}/events`, {
      signal: stream.controller.signal,
      onConnection: (state) => {
        stream.connection = state;
        redraw();
      },
      onEvent: (event) => this.applyEvent(messageId, stream, event),
    })
      .catch((error) => {
        stream.error = error;
        redraw();
      })
      .finally(() => {
        if (this.streams.get(messageId) === stream && !stream.error) this.streams.delete(messageId);
      });
  }

  applyEvent(messageId, stream, event) {
    const message = this.tree.get(messageId);
    switch (event.event_type) {
      case "pending":
        stream.pending = event;
        break;
      case "token":
        if (message.state === "pending") this.tree.put({ ...message, state: "in_progress" });
        stream.retry = null;
        stream.text += event.text;
        break;
      case "retry":
        stream.text = "";
        stream.retry = event;
        break;
      case "gap":
        // Events were trimmed from the stream while we were away: the partial text has a hole.
        // Show what follows; the final message event carries the whole answer.
        stream.text = "";
        break;
      case "message":
        this.tree.put(event.message);
        this.finish(messageId);
        return;
      case "error":
        this.tree.put(event.message || { ...message, state: "failed", error: event.error });
        this.finish(messageId);
        return;
      default:
        return;
    }
    this.queueDraw(messageId);
  }

  finish(messageId) {
    this.streams.delete(messageId);
    if (this.thread().some((m) => m.id === messageId)) this.render();
  }

  /** Redraw a streaming answer at most once per frame, however fast tokens come. */
  queueDraw(messageId) {
    if (this.drawQueued.has(messageId)) return;
    this.drawQueued.add(messageId);
    requestAnimationFrame(() => {
      this.drawQueued.delete(messageId);
      const message = this.tree.get(messageId);
      if (message) this.view.updateAnswer(message, this.streams.get(messageId));
      this.updateComposer();
    });
  }

  /** Where a new prompt goes: under the last finished answer, else beside the unanswered prompt. */
  replyParent() {
    const thread = this.thread();
    const last = thread.at(-1);
    if (!last) return { parentId: null };
    if (last.role === "assistant" && REPLYABLE_STATES.has(last.state)) return { parentId: last.id };
    const prompt = last.role === "prompter" ? last : this.tree.get(last.parent_id);
    if (!prompt.parent_id) return { newChat: true }; // a chat has one root: a second one starts over
    return { parentId: prompt.parent_id };
  }

  /** Send a prompt (in a new chat when none is open) and ask for its answer. */
  async send(text) {
    let { parentId, newChat } = this.replyParent();
    if (newChat) {
      this.newChat(this.systemPrompt);
      parentId = null;
    }
    if (!this.chat) {
      const chat = await api.post("/chats", {});
      this.reset({ ...chat, messages: [] }, this.systemPrompt);
      this.chatList.upsert(chat);
      this.onChatChanged(chat);
    }
    const chatId = this.chat.id;
    const prompt = await api.post(`/chats/${chatId}/prompter_message`, { parent_id: parentId, content: text });
    if (this.chat?.id !== chatId) return;
    this.tree.put(prompt);
    this.tail = prompt.id;
    this.render();
    this.view.scrollToBottom();
    if (!parentId) this.refreshTitle(chatId);
    await this.requestAnswer(prompt.id);
  }

  async refreshTitle(chatId) {
    try {
      const chat = await api.get(`/chats/${chatId}`);
      this.chatList.upsert({ ...chat, messages: undefined });
      if (this.chat?.id === chatId) {
        this.chat.title = chat.title;
        this.onChatChanged(this.chat);
      }
    } catch {
      // the title shows after the next reload
    }
  }

  /** Ask for an answer to a prompt (also: regenerate, which asks again for the same prompt). */
  async requestAnswer(promptId) {
    const chatId = this.chat.id;
    const model = this.preferences.model();
    this.answerErrors.delete(promptId);
    try {
      if (!model) throw new Error("no model is available right now");
      const answer = await api.post(`/chats/${chatId}/assistant_message`, {
        parent_id: promptId,
        model_config_name: model.name,
        sampling_parameters: this.preferences.samplingParameters(),
        system_prompt: this.systemPrompt.trim() || null,
      });
      if (this.chat?.id !== chatId) return;
      this.tree.put(answer);
      this.tail = answer.id;
      this.render();
      this.follow(answer.id);
    } catch (error) {
      if (this.chat?.id !== chatId) return;
      this.answerErrors.set(promptId, { error, model: model?.name });
      // Under an unanswered prompt the error stays in the thread; elsewhere (regenerate) it is a toast.
      if (this.thread().at(-1)?.id !== promptId) toast(describeError(error, { model: model?.name }), { error: true });
      this.render();
      if (error.code === "unknown_model" || error.code === "no_worker") this.preferences.refreshModels().catch(() => {});
    }
  }

  async stop() {
    const answer = this.activeAnswer();
    if (!answer || $("stop").disabled) return;
    $("stop").disabled = true; // until the answer ends (or the cancel fails)
    try {
      await api.post(`/chats/${this.chat.id}/messages/${answer.id}/cancel`, {});
    } catch (error) {
      $("stop").disabled = false;
      toast(`Could not stop the answer: ${describeError(error)}`, { error: true });
    }
  }

  /** A changed prompt is a sibling of the original (the first prompt of a chat starts a new chat). */
  async edit(message, text) {
    if (!message.parent_id) {
      this.newChat(this.systemPrompt);
      await this.send(text);
      return;
    }
    const chatId = this.chat.id;
    try {
      const prompt = await api.post(`/chats/${chatId}/prompter_message`, { parent_id: message.parent_id, content: text });
      this.tree.put(prompt);
      this.tail = this.tree.choose(prompt.id);
      this.render();
      await this.requestAnswer(prompt.id);
    } catch (error) {
      toast(describeError(error), { error: true });
      this.render();
    }
  }

  /** Show another sibling's branch, and remember it on the server (a reload comes back to it). */
  async switchTo(messageId) {
    this.tail = this.tree.choose(messageId);
    this.render();
    this.followActive();
    try {
      await api.put(`/chats/${this.chat.id}`, { active_thread_tail_message_id: this.tail });
    } catch (error) {
      toast(`The branch shown could not be saved: ${describeError(error)}`, { error: true });
    }
  }

  async vote(message, score) {
    try {
      await api.post(`/chats/${this.chat.id}/messages/${message.id}/votes`, { score });
      this.tree.put({ ...message, score });
      this.render();
    } catch (error) {
      toast(describeError(error), { error: true });
    }
  }

  report(message) {
    const dialog = $("report-dialog");
    $("report-reason").value = "";
    dialog.returnValue = "";
    dialog.showModal();
    dialog.addEventListener(
      "close",
      async () => {
        if (dialog.returnValue !== "ok") return;
        const reportType = new FormData($("report-form")).get("report_type");
        try {
          await api.post(`/chats/${this.chat.id}/messages/${message.id}/reports`, {
            report_type: reportType,
            reason: $("report-reason").value,
          });
          this.tree.put({ ...message, reports: [...(message.reports || []), reportType] });
          this.render();
          toast("Thank you: the answer was reported.");
        } catch (error) {
          toast(describeError(error), { error: true });
        }
      },
      { once: true },
    );
  }

  title() {
    return this.chat ? chatTitle(this.chat) : "New chat";
  }
}
