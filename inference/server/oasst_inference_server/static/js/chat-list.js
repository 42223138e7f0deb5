// The sidebar: the user's chats, newest first, a page at a time (GET /chats with cursors), with
// rename, hide (and unhide, when hidden chats are shown), delete, and hide all.

import { api } from "./api.js";
import { $, confirmDialog, h, toast } from "./dom.js";
import { describeError } from "./errors.js";
import { icon } from "./icons.js";

const PAGE_SIZE = 20;

export function chatTitle(chat) {
  return chat?.title || "Untitled chat";
}

export class ChatList {
  constructor({ onOpen, onRemoved }) {
    this.onOpen = onOpen; // (chatId) the user picked a chat
    this.onRemoved = onRemoved; // (chatId) a chat left the list (deleted or hidden)
    this.chats = [];
    this.next = null;
    this.currentId = null;
    $("chat-list-more").addEventListener("click", () => this.loadMore());
    $("show-hidden").addEventListener("change", () => this.reload());
    $("hide-all").addEventListener("click", () => this.hideAll());
  }

  get includeHidden() {
    return $("show-hidden").checked;
  }

  async reload() {
    const page = await api.get(`/chats?limit=${PAGE_SIZE}&include_hidden=${this.includeHidden}`);
    this.chats = page.chats;
    this.next = page.next;
    this.render();
  }

  async loadMore() {
    if (!this.next) return;
    try {
      const page = await api.get(
        `/chats?limit=${PAGE_SIZE}&include_hidden=${this.includeHidden}&after=${encodeURIComponent(this.next)}`,
      );
      const known = new Set(this.chats.map((c) => c.id));
      this.chats.push(...page.chats.filter((c) => !known.has(c.id)));
      this.next = page.next;
      this.render();
    } catch (error) {
      toast(describeError(error), { error: true });
    }
  }

  /** Add a chat at the top, or update it where it is. */
  upsert(chat) {
    const index = this.chats.findIndex((c) => c.id === chat.id);
    if (index >= 0) this.chats[index] = { ...this.chats[index], ...chat };
    else this.chats.unshift(chat);
    this.render();
  }

  setCurrent(chatId) {
    this.currentId = chatId;
    for (const item of $("chat-list").children) {
      if (item.dataset.id === chatId) item.setAttribute("aria-current", "page");
      else item.removeAttribute("aria-current");
    }
  }

  render() {
    $("chat-list").replaceChildren(...this.chats.map((chat) => this.item(chat)));
    $("chat-list-empty").hidden = this.chats.length > 0;
    $("chat-list-more").hidden = !this.next;
  }

  item(chat) {
    const title = chatTitle(chat);
    const link = h(
      "a",
      { href: `/c/${encodeURIComponent(chat.id)}`, title },
      title,
      chat.hidden ? h("span", { className: "tag" }, "(hidden)") : null,
    );
    link.addEventListener("click", (event) => {
      if (event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey) return; // new tab
      event.preventDefault();
      this.onOpen(chat.id);
    });
    const button = (name, label, action) =>
      h("button", { type: "button", className: "ghost", "aria-label": `${label}: ${title}`, title: label, onclick: action }, icon(name));
    const item = h(
      "li",
      { className: "chat-item", dataset: { id: chat.id } },
      link,
      h(
        "div",
        { className: "chat-actions" },
        button("pencil", "Rename", () => this.rename(chat, item)),
        chat.hidden
          ? button("eye", "Unhide", () => this.setHidden(chat, false))
          : button("eyeOff", "Hide", () => this.setHidden(chat, true)),
        button("trash", "Delete", () => this.remove(chat)),
      ),
    );
    if (chat.id === this.currentId) item.setAttribute("aria-current", "page");
    return item;
  }

  rename(chat, item) {
    const input = h("input", { type: "text", maxlength: 200, "aria-label": "Chat title" });
    input.value = chat.title || "";
    let done = false;
    const finish = async (save) => {
      if (done) return;
      done = true;
      const title = input.value.trim();
      if (save && title !== (chat.title || "")) {
        try {
          this.upsert(await api.put(`/chats/${chat.id}`, { title }));
          return;
        } catch (error) {
          toast(describeError(error), { error: true });
        }
      }
      this.render();
    };
    input.addEventListener("keydown", (event) => {
      if (event.key === "Enter") finish(true);
      if (event.key === "Escape") finish(false);
    });
    input.addEventListener("blur", () => finish(true));
    item.replaceChildren(input);
    input.focus();
    input.select();
  }

  async setHidden(chat, hidden) {
    try {
      const updated = await api.put(`/chats/${chat.id}`, { hidden });
      if (hidden && !this.includeHidden) {
        this.chats = this.chats.filter((c) => c.id !== chat.id);
        this.render();
        this.onRemoved(chat.id);
      } else this.upsert(updated);
    } catch (error) {
      toast(describeError(error), { error: true });
    }
  }

  async remove(chat) {
    if (!(await confirmDialog(`Delete “${chatTitle(chat)}”? This cannot be undone.`, "Delete"))) return;
    try {
      await api.delete(`/chats/${chat.id}`);
      this.chats = this.chats.filter((c) => c.id !== chat.id);
      this.render();
      this.onRemoved(chat.id);
    } catch (error) {
      toast(describeError(error), { error: true });
    }
  }

  async hideAll() {
    if (!(await confirmDialog("Hide all your chats? They stay readable under “Show hidden chats”.", "Hide all"))) return;
    try {
      await api.put("/chats/hide_all", {});
      const current = this.currentId;
      await this.reload();
      if (current && !this.includeHidden) this.onRemoved(current);
    } catch (error) {
      toast(describeError(error), { error: true });
    }
  }
}
