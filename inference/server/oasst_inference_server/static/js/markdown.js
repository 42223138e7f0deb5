// Model answers as Markdown: parsed by marked, sanitized by DOMPurify, code highlighted by
// highlight.js, each code block with a copy button.
//
// Model output is untrusted (a prompt can make a model write anything). HTML written by the model
// is shown as text, as it was written, never parsed as markup. What Markdown itself produces is then
// sanitized as a second wall: only its tags, no event handlers, styles, forms or frames; links open
// in a new tab without a referrer; classes only as `language-*` (an answer cannot dress itself up as
// the page's own controls); and images become links, since loading a picture from an address the
// model chose would let an answer send data to any server.

import { Marked } from "../vendor/marked.js";
import DOMPurify from "../vendor/purify.js";
import hljs from "../vendor/highlight.js";
import { copyText, h } from "./dom.js";

const marked = new Marked({
  gfm: true,
  breaks: true,
  renderer: {
    html({ text }) {
      return escapeText(text);
    },
    image({ href, title, text }) {
      const label = text || title || href || "";
      return `<a href="${escapeAttribute(href || "")}">${escapeText(`[image: ${label}]`)}</a>`;
    },
  },
});

const ALLOWED_TAGS = [
  "a", "b", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i",
  "input", "kbd", "li", "ol", "p", "pre", "s", "strong", "sub", "sup", "table", "tbody", "td", "th",
  "thead", "tr", "ul",
];
const ALLOWED_ATTR = ["href", "title", "class", "align", "start", "type", "checked", "disabled"];
const LANGUAGE_CLASS = /^language-[\w+#.-]{1,40}$/;

let sanitizingMarkdown = false; // the hook below is for answers, not for highlight.js's own markup

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (!sanitizingMarkdown) return;
  if (node.hasAttribute("class")) {
    const kept = [...node.classList].filter((c) => LANGUAGE_CLASS.test(c));
    if (kept.length) node.setAttribute("class", kept.join(" "));
    else node.removeAttribute("class");
  }
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
  if (node.tagName === "INPUT") {
    // GFM task lists: any input becomes a read-only checkbox.
    node.setAttribute("type", "checkbox");
    node.setAttribute("disabled", "");
  }
});

function escapeText(text) {
  return text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

function escapeAttribute(text) {
  return escapeText(text).replace(/"/g, "&quot;");
}

function sanitize(html) {
  sanitizingMarkdown = true;
  try {
    return DOMPurify.sanitize(html, { ALLOWED_TAGS, ALLOWED_ATTR, ALLOW_DATA_ATTR: false, RETURN_DOM_FRAGMENT: true });
  } finally {
    sanitizingMarkdown = false;
  }
}

/** The answer's Markdown as a sanitized DocumentFragment. */
export function renderMarkdown(text) {
  return sanitize(marked.parse(text || ""));
}

/** Highlight one code element in place (its text is the code; the result is sanitized too). */
function highlight(code) {
  const match = [...code.classList].find((c) => c.startsWith("language-"));
  const language = match ? match.slice("language-".length) : "";
  const source = code.textContent;
  let result;
  try {
    result = language && hljs.getLanguage(language)
      ? hljs.highlight(source, { language, ignoreIllegals: true })
      : hljs.highlightAuto(source);
  } catch {
    return language;
  }
  const safe = DOMPurify.sanitize(result.value, { ALLOWED_TAGS: ["span"], ALLOWED_ATTR: ["class"] });
  code.innerHTML = safe;
  code.classList.add("hljs");
  return language || result.language || "";
}

/**
 * Render ``text`` into ``container`` (replacing its content). While an answer streams, code is
 * shown plain; ``final`` adds highlighting and the copy buttons once it is complete.
 */
export function renderInto(container, text, { final = true } = {}) {
  container.replaceChildren(renderMarkdown(text));
  for (const pre of container.querySelectorAll("pre")) {
    const code = pre.querySelector("code") || pre;
    const language = final ? highlight(code) : "";
    const copy = h("button", { type: "button", className: "ghost", "aria-label": "Copy code" }, "Copy");
    copy.addEventListener("click", async () => {
      try {
        await copyText(code.textContent);
        copy.textContent = "Copied";
      } catch {
        copy.textContent = "Copy failed";
      }
      setTimeout(() => { copy.textContent = "Copy"; }, 1500);
    });
    const head = h("div", { className: "code-head" }, h("span", {}, language || "code"), final ? copy : null);
    const block = h("div", { className: "code-block" }, head);
    pre.replaceWith(block);
    block.append(pre);
  }
}
