// Start-up: /props (model, chat template, defaults), the adapters, the three modes.

import { json, setRoutedModel } from "./api.js";
import { currentMix, initAdapters, refreshAdapters } from "./adapters.js";
import { initChat, rememberMix, stopChat } from "./chat.js";
import { initCompare, refreshCompare } from "./compare.js";
import { initCompletion, stopCompletion } from "./completion.js";
import { initSettings } from "./settings.js";
import { CHATML_FALLBACK } from "./template.js";

const $ = (id) => document.getElementById(id);
const MODE = "loraserve.mode";

function setMode(mode) {
  for (const b of document.querySelectorAll("[data-mode]")) {
    b.setAttribute("aria-pressed", String(b.dataset.mode === mode));
  }
  for (const s of document.querySelectorAll(".mode")) s.hidden = s.id !== `mode-${mode}`;
  $("conversations-panel").hidden = mode !== "chat";
  localStorage.setItem(MODE, mode);
  if (mode === "compare") refreshCompare();
}

function showError(text) {
  const e = $("error");
  e.textContent = text;
  e.hidden = !text;
}

function mixChanged() {
  rememberMix();
  $("model-info").dataset.mix = currentMix();
}

const MODEL = "loraserve.model";

/** Router mode: the model picker (every model and preset with its status); the chosen
 * one is named in every call, and choosing another reloads the page on it. */
async function pickModel() {
  const models = (await json("/models")).data;
  if (!models.length) throw new Error("the router offers no model (--models-dir, --models-preset)");
  const ids = models.map((m) => m.id);
  const loaded = models.find((m) => m.status?.value === "loaded");
  const saved = localStorage.getItem(MODEL);
  const chosen = ids.includes(saved) ? saved : (loaded || models[0]).id;
  const picker = $("model-picker");
  picker.replaceChildren(
    ...models.map((m) => {
      const o = document.createElement("option");
      o.value = m.id;
      o.textContent = `${m.id} (${m.status?.value || "?"})`;
      o.selected = m.id === chosen;
      return o;
    }),
  );
  picker.addEventListener("change", () => {
    localStorage.setItem(MODEL, picker.value);
    location.reload();
  });
  $("model-picker-label").hidden = false;
  setRoutedModel(chosen);
  localStorage.setItem(MODEL, chosen);
}

async function start() {
  initAdapters(mixChanged);
  let props;
  for (;;) {
    try {
      props = await json("/props");
      if (props.role === "router") {
        await pickModel();
        props = await json("/props"); // the chosen model's (loaded on first use)
      }
      break;
    } catch (e) {
      showError(`Server not ready: ${e.message}. Retrying…`);
      await new Promise((r) => setTimeout(r, 1000));
    }
  }
  showError("");
  const noTemplate = !props.chat_template || props.chat_template === CHATML_FALLBACK;
  const slots = props.total_slots;
  $("model-info").textContent = `${props.model_alias || props.model_path} · ${slots} slot${slots === 1 ? "" : "s"}`;
  if (noTemplate) {
    const note = $("template-note");
    note.textContent =
      "This model has no chat template of its own: chat mode formats messages with a generic ChatML fallback, which a base model was not trained on. Completion mode sends your text as is.";
    note.hidden = false;
  }
  // no --lora-dir: the server cannot load adapters at run time, so the form is not offered
  $("load-form").hidden = props.lora_loading === false;
  initSettings(props.default_generation_settings?.params || {});
  try {
    await refreshAdapters();
  } catch (e) {
    showError(`Could not list adapters: ${e.message}`);
  }
  initChat();
  initCompletion();
  initCompare();
  for (const b of document.querySelectorAll("[data-mode]")) {
    b.addEventListener("click", () => setMode(b.dataset.mode));
  }
  setMode(localStorage.getItem(MODE) || (noTemplate ? "completion" : "chat"));
  if (matchMedia("(max-width: 760px)").matches) $("conversations-panel").open = false;
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && !$("key-dialog").open) {
      stopChat();
      stopCompletion();
    }
  });
  document.body.dataset.ready = "true";
}

start();
