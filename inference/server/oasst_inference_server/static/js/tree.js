// A chat is a tree of messages (docs/api.md, "Branching"): regenerating adds a sibling answer,
// editing a prompt adds a sibling prompt. The page shows one thread, root to leaf, chosen by the
// chat's active tail; at every message with siblings the user can move between them.

export const ACTIVE_STATES = new Set(["pending", "in_progress"]);
export const REPLYABLE_STATES = new Set(["complete", "cancelled"]);

const byCreation = (a, b) => (a.created_at < b.created_at ? -1 : a.created_at > b.created_at ? 1 : a.id < b.id ? -1 : 1);

export class MessageTree {
  constructor(messages = []) {
    this.byId = new Map();
    this.children = new Map(); // parent id ("" for the root) -> messages, oldest first
    this.chosen = new Map(); // parent id -> the child the user last looked at
    for (const message of messages) this.put(message);
  }

  /** Add a message, or replace it with a newer copy of itself. */
  put(message) {
    const known = this.byId.get(message.id);
    this.byId.set(message.id, message);
    const key = message.parent_id || "";
    const siblings = this.children.get(key) || [];
    if (known) siblings[siblings.findIndex((m) => m.id === message.id)] = message;
    else {
      siblings.push(message);
      siblings.sort(byCreation);
    }
    this.children.set(key, siblings);
  }

  get(id) {
    return this.byId.get(id);
  }

  get size() {
    return this.byId.size;
  }

  childrenOf(id) {
    return this.children.get(id || "") || [];
  }

  /** The message and its siblings (same parent), oldest first. */
  siblingsOf(id) {
    const message = this.byId.get(id);
    return message ? this.childrenOf(message.parent_id) : [];
  }

  /** The leaf reached from ``id`` by following, at each step, the remembered or else the newest child. */
  leafFrom(id) {
    let current = this.byId.get(id);
    while (current) {
      const children = this.childrenOf(current.id);
      if (!children.length) break;
      current = children.find((m) => m.id === this.chosen.get(current.id)) || children[children.length - 1];
    }
    return current?.id || null;
  }

  /** The thread shown for ``tailId``: root to tail, then on to a leaf (another client may have added). */
  thread(tailId) {
    let tail = this.byId.get(tailId);
    if (!tail) {
      const roots = this.childrenOf("");
      if (!roots.length) return [];
      tail = this.byId.get(this.leafFrom(roots[roots.length - 1].id));
    }
    const path = [];
    for (let m = tail; m; m = this.byId.get(m.parent_id)) path.unshift(m);
    for (const message of path) this.chosen.set(message.parent_id || "", message.id);
    const below = [];
    for (let m = this.byId.get(this.leafFrom(tail.id)); m && m.id !== tail.id; m = this.byId.get(m.parent_id)) {
      below.unshift(m);
    }
    return [...path, ...below];
  }

  /** Choose ``id`` among its siblings; returns the new tail (the leaf below it). */
  choose(id) {
    const message = this.byId.get(id);
    this.chosen.set(message.parent_id || "", id);
    return this.leafFrom(id);
  }
}
