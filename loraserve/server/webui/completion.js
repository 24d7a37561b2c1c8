// Raw completion mode: the prompt as plain text through /completion (streamed), for base
// models without a chat template; the answer shown as text after the prompt.

import { sse } from "./api.js";
import { mixOf, requestLora } from "./adapters.js";
import { completionInfo, renderInfo } from "./render.js";
import { samplingParams } from "./settings.js";

const $ = (id) => document.getElementById(id);
let controller = null;

/** Stream `prompt` under `lora` (undefined: the server default); calls `onText(piece)` per
 * event and returns the "what happened" info of the final event. */
export async function streamCompletion(prompt, lora, onText, signal) {
  const body = { prompt, stream: true, ...samplingParams() };
  if (lora) body.lora = lora;
  let final = null;
  for await (const ev of sse("/completion", body, signal)) {
    if (ev.content) onText(ev.content, ev);
    if (ev.stop) final = ev;
  }
  return final ? completionInfo(final, mixOf) : null;
}

async function run(ev) {
  ev.preventDefault();
  if (controller) return;
  const prompt = $("completion-input").value;
  const out = $("completion-output");
  const infoEl = $("completion-info");
  const promptSpan = document.createElement("span");
  promptSpan.className = "prompt";
  promptSpan.textContent = prompt;
  const gen = document.createElement("span");
  gen.className = "generated";
  out.replaceChildren(promptSpan, gen);
  renderInfo(infoEl, null);
  controller = new AbortController();
  $("completion-send").disabled = true;
  $("completion-stop").disabled = false;
  out.setAttribute("aria-busy", "true");
  try {
    const info = await streamCompletion(
      prompt,
      requestLora(),
      (text) => gen.append(document.createTextNode(text)),
      controller.signal,
    );
    renderInfo(infoEl, info);
  } catch (e) {
    renderInfo(infoEl, { stop: e.name === "AbortError" ? "stopped" : `error: ${e.message}` });
  } finally {
    controller = null;
    out.removeAttribute("aria-busy");
    $("completion-send").disabled = false;
    $("completion-stop").disabled = true;
  }
}

/** Stop the completion being streamed, if any. */
export function stopCompletion() {
  if (controller) controller.abort();
}

/** Wire completion mode (Ctrl/Cmd+Enter sends from the prompt box). */
export function initCompletion() {
  $("completion-form").addEventListener("submit", run);
  $("completion-stop").addEventListener("click", stopCompletion);
  $("completion-input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      $("completion-form").requestSubmit();
    }
  });
}
