// One open chat: its message tree from the server, the thread shown, the answers being streamed, and
// the actions on it (send, stop, regenerate, edit, switch branch, vote, report).
//
// The server is the truth: the chat, its tree and the branch shown (active_thread_tail_message_id)
// are read from it when a chat opens, so a reload shows exactly what was there. Only the answers
// being written live in the page, as their event streams, and a prompt whose turn the server
// refused (nothing of it was stored: it shows with why, until it is sent again or left).
//
// A prompt is sent as a turn (POST .../turns): the prompt and its answer are created together, and
// the answer streams in the same response. Regenerate asks again for an answer of a stored prompt.

import { api } from "./api.js";
import { chatTitle } from "./chat-list.js";
import { $, copyText, toast } from "./dom.js";
import { ApiError, NetworkError, describeError, refusesPrompt } from "./errors.js";
import { TurnInterrupted, followEvents, followTurn } from "./events.js";
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
      retryAnswer: (prompt) => (prompt.unsent ? this.resend(prompt.content) : this.requestAnswer(prompt.id)),
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
    for (const turn of this.turns?.values() || []) turn.abort();
    this.chat = chat;
    this.tree = new MessageTree(chat?.messages || []);
    this.tail = chat?.active_thread_tail_message_id || null;
    this.streams = new Map(); // answer id -> {controller, text, pending, retry, connection, error}
    this.answerErrors = new Map(); // prompt id -> {error, model}: asking for its answer failed
    this.turns = new Set(); // the abort controllers of turns sent, until their messages are created
    this.unsent = null; // {parentId, content, error, model}: a prompt whose turn was refused
    this.drawQueued = new Set();
    this.view.editing = null;
    const thread = this.thread();
    const configured = [...thread].reverse().find((m) => m.role === "assistant" && m.system_prompt);
    this.systemPrompt = systemPrompt ?? configured?.system_prompt ?? "";
  }

  /** The thread shown: the branch of the tail, or the way to a refused prompt and that prompt. */
  thread() {
    if (!this.unsent) return this.tree.thread(this.tail);
    const { parentId, content, error, model } = this.unsent;
    const above = parentId ? this.tree.thread(parentId) : [];
    const prompt = { id: "unsent", role: "prompter", parent_id: parentId, content, unsent: true, refusal: { error, model } };
    return [...above.slice(0, above.findIndex((m) => m.id === parentId) + 1), prompt];
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

  /** Start keeping the state of an answer being streamed. */
  track(messageId, controller = new AbortController()) {
    const stream = { controller, text: "", pending: null, retry: null, connection: "open", error: null };
    this.streams.set(messageId, stream);
    return stream;
  }

  connectionChanged(messageId, stream, state) {
    stream.connection = state;
    this.queueDraw(messageId);
  }

  /** When an answer's stream is over: a final error stays on show, else the stream is forgotten. */
  settle(messageId, stream, following) {
    following
      .catch((error) => {
        stream.error = error;
        this.queueDraw(messageId);
      })
      .finally(() => {
        if (this.streams.get(messageId) === stream && !stream.error) this.streams.delete(messageId);
      });
  }

  follow(messageId) {
    if (this.streams.has(messageId)) return;
    const stream = this.track(messageId);
    const following = followEvents(`/chats/${this.chat.id}/messages/${messageId}/events`, {
      signal: stream.controller.signal,
      onConnection: (state) => this.connectionChanged(messageId, stream, state),
      onEvent: (event) => this.applyEvent(messageId, stream, event),
    });
    this.settle(messageId, stream, following);
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

  /** Where a new prompt goes: under the last finished answer, else beside the unanswered prompt (in
   * place of a refused one). */
  replyParent() {
    if (this.unsent) return { parentId: this.unsent.parentId };
    const thread = this.thread();
    const last = thread.at(-1);
    if (!last) return { parentId: null };
    if (last.role === "assistant" && REPLYABLE_STATES.has(last.state)) return { parentId: last.id };
    const prompt = last.role === "prompter" ? last : this.tree.get(last.parent_id);
    if (!prompt.parent_id) return { newChat: true }; // a chat has one root: a second one starts over
    return { parentId: prompt.parent_id };
  }

  /** Send a prompt (in a new chat when none is open) and have it answered. Rejects when nothing was
   * sent: the network, or the prompt itself refused (the caller keeps the text). */
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
    await this.sendTurn(parentId, text);
  }

  /** How an answer is asked for (alone, or in a turn): the model, its sampling, the system prompt. */
  answerRequest(model) {
    return {
      model_config_name: model.name,
      sampling_parameters: this.preferences.samplingParameters(),
      system_prompt: this.systemPrompt.trim() || null,
    };
  }

  /**
   * Send a turn and follow its answer. Resolves once the server created both messages (the answer
   * then streams on), or once it refused the turn for its answer (nothing was stored: the prompt
   * shows unsent, with why). Rejects when nothing was sent, or the prompt itself was refused.
   */
  async sendTurn(parentId, content) {
    const chatId = this.chat.id;
    const model = this.preferences.model();
    if (!model) throw new Error("no model is available right now");
    const controller = new AbortController();
    this.turns.add(controller);
    let answerId = null;
    let stream = null;
    let created;
    const whenCreated = new Promise((resolve) => {
      created = resolve;
    });
    const turn = followTurn(`/chats/${chatId}/turns`, { parent_id: parentId, content, ...this.answerRequest(model) }, {
      signal: controller.signal,
      onCreated: ({ prompter_message: prompt, assistant_message: answer }) => {
        answerId = answer.id;
        this.turns.delete(controller);
        if (!controller.signal.aborted) stream = this.accept(prompt, answer, controller);
        created();
        return `/chats/${chatId}/messages/${answer.id}/events`;
      },
      onEvent: (event) => stream && this.applyEvent(answerId, stream, event),
      onConnection: (state) => stream && this.connectionChanged(answerId, stream, state),
    });
    const failure = turn.then(
      () => null,
      (error) => error,
    );
    await Promise.race([whenCreated, failure]);
    this.turns.delete(controller);
    if (stream) {
      this.settle(answerId, stream, turn);
      return;
    }
    const error = await failure;
    if (controller.signal.aborted || this.chat?.id !== chatId || answerId) return;
    if (error instanceof TurnInterrupted) {
      await this.recover(chatId, parentId, content);
      return;
    }
    if (!(error instanceof ApiError) || refusesPrompt(error)) throw error;
    this.refused(parentId, content, error, model.name);
  }

  /** The server created the turn: show the prompt and follow its answer on the same response. */
  accept(prompt, answer, controller) {
    this.unsent = null;
    this.tree.put(prompt);
    this.tree.put(answer);
    this.tail = answer.id;
    const stream = this.track(answer.id, controller);
    this.render();
    this.view.scrollToBottom();
    if (!prompt.parent_id) this.refreshTitle(prompt.chat_id);
    return stream;
  }

  /** The server refused the turn for its answer: show the prompt unsent, why, and a retry. */
  refused(parentId, content, error, model) {
    this.unsent = { parentId, content, error, model };
    this.render();
    this.view.scrollToBottom();
    if (error.code === "unknown_model" || error.code === "no_worker") this.preferences.refreshModels().catch(() => {});
  }

  /** The turn's stream broke before it said what it created: the server knows whether it did. */
  async recover(chatId, parentId, content) {
    await this.open(chatId);
    const sent = this.tree.childrenOf(parentId).some((m) => m.role === "prompter" && m.content === content);
    if (!sent) throw new NetworkError("the connection broke while the message was sent");
  }

  /** Send a refused prompt again (as it was, or as edited), in its place. */
  async resend(content) {
    if (!this.unsent) return; // already sent again (a second click)
    const { parentId } = this.unsent;
    try {
      await this.sendTurn(parentId, content);
    } catch (error) {
      this.refused(parentId, content, error, this.preferences.model()?.name);
    }
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
      const answer = await api.post(`/chats/${chatId}/assistant_message`, { parent_id: promptId, ...this.answerRequest(model) });
      if (this.chat?.id !== chatId) return;
      this.unsent = null;
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

  /** A changed prompt is a sibling of the original (the first prompt of a chat starts a new chat); a
   * changed refused prompt takes its place. */
  async edit(message, text) {
    if (message.unsent) {
      await this.resend(text);
      return;
    }
    try {
      if (message.parent_id) await this.sendTurn(message.parent_id, text);
      else {
        this.newChat(this.systemPrompt);
        await this.send(text);
      }
    } catch (error) {
      toast(describeError(error, { model: this.preferences.model()?.name }), { error: true });
      this.render();
    }
  }

  /** Show another sibling's branch, and remember it on the server (a reload comes back to it). */
  async switchTo(messageId) {
    this.unsent = null; // a refused prompt is not stored: leaving its place lets it go
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
