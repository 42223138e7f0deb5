// The web chat page: signs the user in, then wires the sidebar, the open chat, the model picker, the
// settings and the composer together. A chat's address is /c/<chat id>, so a reload (or a link)
// opens the same chat, read back from the server. Admin users also have the admin page, at /manage.

import { AdminView } from "./admin.js";
import { api, onSessionExpired } from "./api.js";
import { ChatList } from "./chat-list.js";
import { ChatController } from "./chat.js";
import { $, autosize, h, showScreen, toast } from "./dom.js";
import { ApiError, describeError } from "./errors.js";
import { fillIcons } from "./icons.js";
import { loadTokens, signOut } from "./session.js";
import { Preferences, SettingsDialog } from "./settings.js";
import { signIn } from "./signin.js";

const APP_NAME = "Open-Assistant chat";
const MODEL_POLL_MS = 10_000;
const phoneWidth = window.matchMedia("(max-width: 760px)");

const preferences = new Preferences({ onModelsChanged: () => showModels() });
const chatList = new ChatList({
  onOpen: (id) => navigate(id),
  onRemoved: (id) => {
    if (chat.chat?.id === id) navigate(null);
  },
});
const chat = new ChatController({ preferences, chatList, onChatChanged: (opened) => showChat(opened) });
const settingsDialog = new SettingsDialog(preferences, {
  getSystemPrompt: () => chat.systemPrompt,
  setSystemPrompt: (text) => {
    chat.systemPrompt = text;
  },
});
const admin = new AdminView({
  onRefused: () => {
    $("open-admin").hidden = true;
  },
});
const ADMIN_PATH = "/manage";
let started = false;
let sending = false; // a prompt is on its way (the model poll may re-enable Send meanwhile)
let modelTimer = null;

function chatIdFromLocation() {
  const match = window.location.pathname.match(/^\/c\/([^/]+)$/);
  return match ? decodeURIComponent(match[1]) : null;
}

function isAdminPath() {
  return window.location.pathname === ADMIN_PATH;
}

function showBanner(text, { info = false } = {}) {
  $("banner").textContent = text;
  $("banner").classList.toggle("info", info);
  $("banner").hidden = !text;
}

/** The open chat changed (or its title): the header, the tab title, the address, the sidebar. */
function showChat(opened) {
  if (admin.isOpen()) return; // an answer or title arriving meanwhile shows once the chat is back
  const title = chat.title();
  $("chat-title").textContent = title;
  document.title = opened ? `${title} · ${APP_NAME}` : APP_NAME;
  chatList.setCurrent(opened?.id || null);
  const path = opened ? `/c/${encodeURIComponent(opened.id)}` : "/";
  if (window.location.pathname !== path) window.history.pushState({}, "", path);
}

async function navigate(chatId) {
  if (admin.isOpen()) admin.close();
  setSidebar(false);
  showBanner("");
  if (!chatId) {
    chat.newChat();
    $("input").focus();
    return;
  }
  try {
    await chat.open(chatId);
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) {
      toast("That chat does not exist (any more).", { error: true });
      chat.newChat();
    } else showBanner(describeError(error));
  }
}

function openAdmin() {
  setSidebar(false);
  showBanner("");
  if (!isAdminPath()) window.history.pushState({}, "", ADMIN_PATH);
  admin.open();
  $("admin-refresh").focus();
}

/** Fill the model picker from the live list; with no model, say so and keep checking. */
function showModels() {
  const select = $("model");
  const current = preferences.model();
  select.replaceChildren(
    ...preferences.models.map((m) => h("option", { value: m.name, title: m.description }, m.name)),
  );
  select.disabled = preferences.models.length === 0;
  if (current) select.value = current.name;
  $("model-description").textContent = current?.description || "";
  $("send").disabled = !current || sending;
  if (!current) {
    showBanner("No model is available right now: no worker is connected. This page checks again every few seconds.", { info: true });
  } else if ($("banner").classList.contains("info")) showBanner("");
}

/** The sidebar is a drawer on a phone: open it over the chat, or close it. */
function setSidebar(open) {
  const wasOpen = $("app").classList.contains("sidebar-open");
  $("app").classList.toggle("sidebar-open", open);
  $("scrim").hidden = !open;
  $("toggle-sidebar").setAttribute("aria-expanded", String(open));
  // Off screen, the closed drawer must not take focus; while it is open, the chat behind it must not.
  $("sidebar").inert = phoneWidth.matches && !open;
  $("main").inert = phoneWidth.matches && open;
  $("admin-view").inert = phoneWidth.matches && open;
  if (open) $("new-chat").focus();
  else if (wasOpen && phoneWidth.matches) $("toggle-sidebar").focus();
}

async function submit() {
  const input = $("input");
  const text = input.value.trim();
  if (!text || sending || !preferences.model() || chat.activeAnswer()) return;
  sending = true;
  input.value = "";
  autosize(input);
  $("send").disabled = true;
  showBanner("");
  try {
    await chat.send(text);
  } catch (error) {
    input.value = text; // nothing was sent: keep what the user wrote
    autosize(input);
    showBanner(describeError(error, { model: preferences.model()?.name }));
  } finally {
    sending = false;
    $("send").disabled = !preferences.model();
    input.focus();
  }
}

function bindControls() {
  fillIcons();
  setSidebar(false);
  phoneWidth.addEventListener("change", () => setSidebar(false));
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    submit();
  });
  $("input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      submit();
    }
    if (event.key === "Escape" && chat.activeAnswer()) chat.stop();
  });
  $("input").addEventListener("input", () => autosize($("input")));
  $("stop").addEventListener("click", () => chat.stop());
  $("new-chat").addEventListener("click", () => navigate(null));
  $("model").addEventListener("change", () => {
    preferences.update({ model_config_name: $("model").value });
    $("model-description").textContent = preferences.model()?.description || "";
  });
  $("open-settings").addEventListener("click", () => settingsDialog.open());
  $("toggle-sidebar").addEventListener("click", () => setSidebar(!$("app").classList.contains("sidebar-open")));
  $("scrim").addEventListener("click", () => setSidebar(false));
  $("open-admin").addEventListener("click", (event) => {
    event.preventDefault();
    openAdmin();
  });
  $("admin-back").addEventListener("click", (event) => {
    event.preventDefault();
    navigate(chat.chat?.id || null);
  });
  $("sign-out").addEventListener("click", async () => {
    admin.close();
    chat.reset(null);
    await signOut();
    start();
  });
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && $("app").classList.contains("sidebar-open")) setSidebar(false);
    if (event.key.toLowerCase() === "o" && event.shiftKey && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      navigate(null);
    }
  });
  window.addEventListener("popstate", () => (isAdminPath() ? openAdmin() : navigate(chatIdFromLocation())));
  window.addEventListener("focus", () => preferences.refreshModels().catch(() => {}));
  onSessionExpired(() => {
    if (!started) return;
    started = false;
    admin.close();
    chat.reset(null);
    start("Your session has expired. Sign in again.");
  });
}

/** Sign in if needed, then load the user's settings, the models, the chat list and the open chat. */
async function start(notice = "") {
  clearInterval(modelTimer);
  if (!loadTokens()) await signIn(notice);
  showScreen("loading");
  let account;
  try {
    account = await api.get("/account");
    $("account-name").textContent = account.display_name;
    // Only a hint for the page: the admin API itself refuses everyone else.
    $("open-admin").hidden = !account.is_admin;
    await preferences.load();
    await preferences.refreshModels();
    showModels();
    await chatList.reload();
  } catch (error) {
    if (!loadTokens()) {
      start("Your session has expired. Sign in again.");
      return;
    }
    $("loading").textContent = `Could not load the page: ${describeError(error)} Reload to try again.`;
    return;
  }
  started = true;
  showScreen("app");
  modelTimer = setInterval(() => preferences.refreshModels().catch(() => {}), MODEL_POLL_MS);
  if (isAdminPath() && account.is_admin) {
    openAdmin();
    return;
  }
  if (isAdminPath()) window.history.replaceState({}, "", "/");
  await navigate(chatIdFromLocation());
}

bindControls();
start();
