// Small DOM helpers. Text always goes in as text (textContent), never as HTML: the only HTML the page
// inserts is sanitized Markdown (markdown.js).

/** Create an element: h("button", {type: "button", onclick: f, "aria-label": "Stop"}, "Stop"). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (key === "className") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export const $ = (id) => document.getElementById(id);

/** Show one of the page's top-level screens (loading, sign-in, app) and hide the others. */
export function showScreen(id) {
  for (const screen of ["loading", "signin", "app"]) $(screen).hidden = screen !== id;
}

export function toast(text, { error = false, timeout = 6000 } = {}) {
  const el = h("div", { className: error ? "toast error" : "toast" }, text);
  $("toasts").append(el);
  setTimeout(() => el.remove(), timeout);
}

/** A yes/no question in the page's confirm dialog; resolves true for OK. */
export function confirmDialog(text, okLabel = "OK") {
  const dialog = $("confirm-dialog");
  $("confirm-text").textContent = text;
  $("confirm-ok").textContent = okLabel;
  dialog.returnValue = "";
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
  });
}

export function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
  });
}

/** Grow a textarea with its content, up to its CSS max-height. */
export function autosize(textarea) {
  textarea.style.height = "auto";
  textarea.style.height = `${textarea.scrollHeight}px`;
}

export async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    await navigator.clipboard.writeText(text);
    return;
  }
  // Plain http on another host is not a secure context: the old way still works there.
  const area = h("textarea", { className: "visually-hidden", readonly: true });
  area.value = text;
  document.body.append(area);
  area.select();
  document.execCommand("copy");
  area.remove();
}
