// The user's choices (model, sampling preset or custom parameters, theme), kept on the server per
// user (GET/PUT /account/settings), and the live list of models (/configs/model_configs) with each
// model's sampling presets (its parameter_configs).

import { api, publicGet } from "./api.js";
import { $, h } from "./dom.js";
import { describeError } from "./errors.js";

const CUSTOM = "custom";
const PARAMETERS = {
  temperature: Number.parseFloat,
  top_p: Number.parseFloat,
  top_k: (v) => Number.parseInt(v, 10),
  repetition_penalty: Number.parseFloat,
  max_new_tokens: (v) => Number.parseInt(v, 10),
  seed: (v) => Number.parseInt(v, 10),
};
const SAVE_DELAY_MS = 400;
const darkQuery = window.matchMedia("(prefers-color-scheme: dark)");

/** Light or dark on the root element; "system" follows the device, also when it changes. */
export function applyTheme(preference) {
  const dark = preference === "dark" || (preference !== "light" && darkQuery.matches);
  document.documentElement.dataset.theme = dark ? "dark" : "light";
}

export class Preferences {
  constructor({ onModelsChanged }) {
    this.models = [];
    this.values = { model_config_name: null, preset: null, custom_sampling_parameters: null, theme: "system" };
    this.onModelsChanged = onModelsChanged;
    this.saveTimer = null;
    darkQuery.addEventListener("change", () => applyTheme(this.values.theme));
  }

  async load() {
    this.values = await api.get("/account/settings");
    applyTheme(this.values.theme);
  }

  /** Remember a change on the server (a burst of changes is one request). */
  update(changes) {
    Object.assign(this.values, changes);
    clearTimeout(this.saveTimer);
    this.saveTimer = setTimeout(() => this.save(), SAVE_DELAY_MS);
  }

  async save() {
    clearTimeout(this.saveTimer);
    try {
      this.values = await api.put("/account/settings", this.values);
      $("settings-error").hidden = true;
    } catch (error) {
      $("settings-error").textContent = `Your settings could not be saved: ${describeError(error)}`;
      $("settings-error").hidden = false;
    }
  }

  async refreshModels() {
    const models = (await publicGet("/configs/model_configs")).filter((m) => m.kind !== "embedding");
    const before = JSON.stringify(this.models.map((m) => m.name));
    this.models = models;
    if (JSON.stringify(models.map((m) => m.name)) !== before) this.onModelsChanged();
  }

  /** The chosen model if it is live, else the first live one (null when none is). */
  model() {
    return this.models.find((m) => m.name === this.values.model_config_name) || this.models[0] || null;
  }

  presetName() {
    const model = this.model();
    const presets = model?.parameter_configs || [];
    const chosen = this.values.preset;
    if (chosen === CUSTOM || presets.some((p) => p.name === chosen)) return chosen;
    return presets[0]?.name || CUSTOM;
  }

  /** The sampling parameters a new answer is asked with. */
  samplingParameters() {
    const name = this.presetName();
    if (name === CUSTOM) return { ...(this.values.custom_sampling_parameters || {}) };
    return { ...this.model().parameter_configs.find((p) => p.name === name).sampling_parameters };
  }
}

/** The chat settings dialog: system prompt (of the chat), preset or custom parameters, theme. */
export class SettingsDialog {
  constructor(preferences, { getSystemPrompt, setSystemPrompt }) {
    this.preferences = preferences;
    this.getSystemPrompt = getSystemPrompt;
    this.setSystemPrompt = setSystemPrompt;
    this.dialog = $("settings-dialog");
    $("settings-preset").addEventListener("change", () => {
      this.preferences.update({ preset: $("settings-preset").value });
      this.showParameters();
    });
    for (const name of Object.keys(PARAMETERS)) {
      $(`param-${name}`).addEventListener("change", () => this.readCustom());
    }
    $("settings-theme").addEventListener("change", () => {
      this.preferences.update({ theme: $("settings-theme").value });
      applyTheme($("settings-theme").value);
    });
    $("settings-system-prompt").addEventListener("input", () => this.setSystemPrompt($("settings-system-prompt").value));
    this.dialog.addEventListener("close", () => this.preferences.save());
  }

  open() {
    const model = this.preferences.model();
    const select = $("settings-preset");
    select.replaceChildren(
      ...(model?.parameter_configs || []).map((p) => h("option", { value: p.name }, p.name)),
      h("option", { value: CUSTOM }, "Custom"),
    );
    select.value = this.preferences.presetName();
    $("settings-theme").value = this.preferences.values.theme;
    $("settings-system-prompt").value = this.getSystemPrompt();
    this.showParameters();
    this.dialog.showModal();
  }

  /** Show the preset's parameters (read-only), or the user's custom ones (editable). */
  showParameters() {
    const custom = $("settings-preset").value === CUSTOM;
    const model = this.preferences.model();
    const preset = model?.parameter_configs.find((p) => p.name === $("settings-preset").value);
    $("settings-preset-description").textContent = custom
      ? "Your own parameters, used with every model."
      : preset?.description || "";
    const values = custom ? this.preferences.values.custom_sampling_parameters || {} : preset?.sampling_parameters || {};
    for (const name of Object.keys(PARAMETERS)) {
      const input = $(`param-${name}`);
      input.value = values[name] ?? "";
      input.disabled = !custom;
    }
  }

  readCustom() {
    const parameters = {};
    for (const [name, parse] of Object.entries(PARAMETERS)) {
      const input = $(`param-${name}`);
      if (input.value === "") continue;
      if (!input.checkValidity()) {
        $("settings-error").textContent = `${input.parentElement.textContent.trim()}: ${input.validationMessage}`;
        $("settings-error").hidden = false;
        return;
      }
      parameters[name] = parse(input.value);
    }
    $("settings-error").hidden = true;
    this.preferences.update({ custom_sampling_parameters: parameters });
  }
}
