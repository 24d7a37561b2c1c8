// Start-up: /props (model, chat template, defaults), the adapters, the three modes.

import { json } from "./api.js";
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

async function start() {
  initAdapters(mixChanged);
  let props;
  for (;;) {
    try {
      props = await json("/props");
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
