// The admin page (/manage), for admin users only: the live workers (model, trust, load, what each can
// load), the worker keys, the queues, the API keys with their limits and usage, and the flagged
// messages, read from the admin API. The server decides who may read them (403 for anyone else); the
// page only draws what it is given, as text. A route this server does not have (404) is "not available".

import { api } from "./api.js";
import { $, h } from "./dom.js";
import { ApiError, describeError } from "./errors.js";

const REFRESH_MS = 10_000;

// What the page reads: section -> the routes it is drawn from.
const SOURCES = {
  fleet: "/admin/fleet",
  sessions: "/admin/worker_sessions",
  workerKeys: "/admin/workers",
  queues: "/admin/queues",
  keys: "/admin/keys",
  flags: "/admin/moderation/flags",
};

/** One route's answer: {data}, or {missing} (404: the server has no such route), or {error}. */
async function load(path) {
  try {
    return { data: await api.get(path) };
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) return { missing: true };
    return { error };
  }
}

const text = (value) => (value === null || value === undefined || value === "" ? "—" : String(value));
const count = (value) => (typeof value === "number" ? String(value) : "—");
const money = (value) => (typeof value === "number" ? `$${value.toFixed(2)}` : "—");
const seconds = (value) => (typeof value === "number" ? `${value.toFixed(1)} s` : "—");
const when = (iso) => {
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? text(iso) : date.toLocaleString();
};
const list = (items) => (Array.isArray(items) && items.length ? items.map(String).join(", ") : "—");

/** A table of text cells: columns are [label, {num: true}?]; rows are {cells, data}. */
function table(columns, rows) {
  const head = h("tr", {}, columns.map(([label]) => h("th", { scope: "col" }, label)));
  const body = rows.map(({ cells, data }) =>
    h(
      "tr",
      { dataset: data },
      cells.map((cell, i) => {
        const options = columns[i][1] || {};
        const className = options.num ? "num" : options.className;
        return h("td", { className }, cell instanceof Node ? cell : text(cell));
      }),
    ),
  );
  return h("table", {}, h("thead", {}, head), h("tbody", {}, body));
}

function show(id, ...content) {
  $(id).replaceChildren(...content);
}

function note(id, sentence, className = "muted") {
  show(id, h("p", { className }, sentence));
}

/** Draw a section from its answer, or say why it cannot be drawn. */
function drawSection(id, result, draw) {
  if (result.missing) note(id, "Not available on this server.");
  else if (result.error) note(id, `Could not load this: ${describeError(result.error)}`, "error");
  else draw(result.data);
}

function trustOf(session) {
  if (!session) return "—";
  if (session.flagged) return h("span", { className: "state-bad" }, "flagged");
  if (session.trusted === true) return "trusted";
  if (session.trusted === false) return "untrusted";
  return "—";
}

function modelOf(worker) {
  let model = worker.loaded ? worker.model_config_name : `${worker.model_config_name} (not loaded)`;
  if (worker.switch) {
    const target = worker.switch.action === "load" ? `loading ${worker.switch.model_config_name}` : "unloading";
    model += `; ${target}${worker.switch.step ? ` (${worker.switch.step})` : ""}`;
  }
  if (worker.draining) model += "; draining";
  return model;
}

function loadOf(worker, session) {
  const slots = session?.max_parallel_requests;
  return typeof slots === "number" ? `${worker.in_flight} / ${slots}` : String(worker.in_flight);
}

function drawWorkers(fleet, sessionsResult) {
  const sessions = new Map((sessionsResult.data || []).map((s) => [s.session_id, s]));
  if (!fleet.workers.length) {
    note("admin-workers", "No worker is connected.");
    return;
  }
  const rows = fleet.workers.map((worker) => {
    const session = sessions.get(worker.session_id);
    const backend = session?.backend_kind
      ? `${session.backend_kind}${session.backend_healthy === false ? " (unhealthy)" : ""}`
      : "—";
    return {
      data: { sessionId: worker.session_id, model: worker.model_config_name },
      cells: [
        worker.worker_name || "(unregistered key)",
        h("code", {}, worker.session_id),
        modelOf(worker),
        trustOf(session),
        loadOf(worker, session),
        backend,
        list(worker.servable.map((m) => m.name)),
      ],
    };
  });
  const columns = [["Worker"], ["Session"], ["Model"], ["Trust"], ["In flight / slots", { num: true }],
    ["Backend"], ["Can load"]];
  show("admin-workers", table(columns, rows));
}

function drawWorkerKeys(workers) {
  if (!workers.length) {
    note("admin-worker-keys", "No worker key is registered.");
    return;
  }
  const rows = workers.map((w) => ({
    data: { workerId: w.id },
    cells: [
      w.name,
      h("code", {}, w.api_key_prefix),
      count(w.connected_sessions),
      w.flagged_at ? h("span", { className: "state-bad" }, `flagged: ${text(w.flag_reason)}`)
        : w.trusted ? "trusted" : "untrusted",
      w.allowed_models === null ? "any" : list(w.allowed_models),
      count(w.max_slots),
    ],
  }));
  const columns = [["Name"], ["Key"], ["Sockets", { num: true }], ["Trust"], ["Allowed models"],
    ["Max slots", { num: true }]];
  show("admin-worker-keys", table(columns, rows));
}

function drawQueues(status) {
  if (!status.models.length) {
    note("admin-queues", "No model has a queue.");
    return;
  }
  const sum = (items, key) => items.reduce((total, item) => total + (item[key] || 0), 0);
  const rows = status.models.map((q) => ({
    data: { model: q.model_config_name },
    cells: [
      q.model_config_name,
      count(q.depth),
      seconds(q.oldest_wait_seconds),
      count(q.backlog.length),
      count(q.workers.length),
      count(sum(q.workers, "in_flight")),
      count(sum(q.service, "tokens")),
    ],
  }));
  const window = Math.round(status.window_seconds);
  const columns = [["Model"], ["Waiting", { num: true }], ["Oldest wait", { num: true }],
    ["Users waiting", { num: true }], ["Workers", { num: true }], ["In flight", { num: true }],
    [`Tokens (last ${window} s)`, { num: true }]];
  show("admin-queues", table(columns, rows));
}

function budgetOf(limits) {
  const parts = [];
  if (typeof limits.budget_tokens === "number") parts.push(`${limits.budget_tokens} tokens`);
  if (typeof limits.budget_usd === "number") parts.push(money(limits.budget_usd));
  if (!parts.length) return "—";
  return `${parts.join(" or ")}${limits.budget_period ? ` a ${limits.budget_period}` : ""}`;
}

function drawKeys(keys) {
  if (!keys.length) {
    note("admin-keys", "No API key exists.");
    return;
  }
  const rows = keys.map((k) => {
    const limits = k.limits || {};
    const usage = k.usage || {};
    return {
      data: { keyId: k.id },
      cells: [
        k.name,
        h("code", {}, text(k.prefix)),
        h("code", {}, text(k.user_id)),
        k.revoked_at ? h("span", { className: "state-bad" }, `revoked ${when(k.revoked_at)}`) : "active",
        count(limits.requests_per_minute),
        count(limits.tokens_per_minute),
        budgetOf(limits),
        limits.allowed_models == null ? "any" : list(limits.allowed_models),
        count(usage.requests_today),
        count(usage.tokens_today),
        money(usage.spent_usd_period),
      ],
    };
  });
  const columns = [["Name"], ["Key"], ["User"], ["State"], ["Requests / min", { num: true }],
    ["Tokens / min", { num: true }], ["Budget"], ["Models"], ["Requests today", { num: true }],
    ["Tokens today", { num: true }], ["Spent this period", { num: true }]];
  show("admin-keys", table(columns, rows));
}

function drawFlags(flags) {
  if (!flags.length) {
    note("admin-flags", "No message was flagged.");
    return;
  }
  const rows = flags.map((f) => ({
    data: { flagId: f.id },
    cells: [
      when(f.created_at),
      f.stage,
      f.check,
      f.action,
      list(f.categories),
      f.excerpt,
      h("code", {}, f.chat_id ? `${f.chat_id} / ${text(f.message_id)}` : text(f.message_id)),
      h("code", {}, text(f.user_id)),
    ],
  }));
  const columns = [["When"], ["Stage"], ["Check"], ["Action"], ["Categories"],
    ["Excerpt", { className: "excerpt" }], ["Chat / message"], ["User"]];
  show("admin-flags", table(columns, rows));
}

const SECTIONS = ["admin-workers", "admin-worker-keys", "admin-queues", "admin-keys", "admin-flags"];

export class AdminView {
  /** ``onRefused``: the server says this user is not an admin (any more). */
  constructor({ onRefused }) {
    this.onRefused = onRefused;
    this.timer = null;
    this.loading = null;
    this.generation = 0; // a refresh that ends after the view was closed draws nothing
    this.onVisibility = () => {
      if (!document.hidden && this.isOpen()) this.refresh();
    };
    $("admin-refresh").addEventListener("click", () => this.refresh());
  }

  isOpen() {
    return !$("admin-view").hidden;
  }

  open() {
    $("main").hidden = true;
    $("admin-view").hidden = false;
    document.title = "Admin · Open-Assistant chat";
    if (!this.timer) {
      // Periodically, while the page is visible; at once when it becomes visible again.
      this.timer = setInterval(() => {
        if (!document.hidden) this.refresh();
      }, REFRESH_MS);
      document.addEventListener("visibilitychange", this.onVisibility);
    }
    this.refresh();
  }

  close() {
    clearInterval(this.timer);
    this.timer = null;
    document.removeEventListener("visibilitychange", this.onVisibility);
    this.generation++;
    $("admin-view").hidden = true;
    $("main").hidden = false;
  }

  /** Read everything again (one refresh at a time; a click during one waits for it). */
  refresh() {
    if (!this.loading) this.loading = this.load().finally(() => (this.loading = null));
    return this.loading;
  }

  async load() {
    const generation = this.generation;
    $("admin-refresh").disabled = true;
    $("admin-view").setAttribute("aria-busy", "true");
    const names = Object.keys(SOURCES);
    const results = Object.fromEntries(
      (await Promise.all(names.map((name) => load(SOURCES[name])))).map((result, i) => [names[i], result]),
    );
    $("admin-refresh").disabled = false;
    $("admin-view").setAttribute("aria-busy", "false");
    if (generation !== this.generation) return;
    const refused = Object.values(results).some((r) => r.error instanceof ApiError && r.error.status === 403);
    $("admin-error").hidden = !refused;
    if (refused) {
      $("admin-error").textContent = "This account is not an admin: the server refused the admin data.";
      for (const id of SECTIONS) show(id);
      $("admin-updated").textContent = "";
      this.onRefused();
      return;
    }
    drawSection("admin-workers", results.fleet, (fleet) => drawWorkers(fleet, results.sessions));
    drawSection("admin-worker-keys", results.workerKeys, drawWorkerKeys);
    drawSection("admin-queues", results.queues, drawQueues);
    drawSection("admin-keys", results.keys, drawKeys);
    drawSection("admin-flags", results.flags, drawFlags);
    $("admin-updated").textContent = `Updated ${new Date().toLocaleTimeString()}`;
  }
}
