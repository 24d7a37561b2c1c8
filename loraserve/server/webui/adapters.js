// The adapter panel: one labelled slider (and number box) per loaded adapter, a switch
// between "this conversation" (the mix goes in each request's `lora` field) and "server
// default" (POST /lora-adapters), and run-time load/unload (when the server has --lora-dir).

import { json } from "./api.js";

const TARGET = "loraserve.mixTarget";
let adapters = []; // [{id, name, path, scale}] from GET /lora-adapters (scale: server's)
const mine = new Map(); // adapter id -> this conversation's scale
let target = localStorage.getItem(TARGET) === "server" ? "server" : "conversation";
let changed = () => {};

const fmt = (x) => (Math.round(x * 100) / 100).toFixed(2);
const shown = () => (target === "server" ? serverMap() : mine);

function serverMap() {
  return new Map(adapters.map((a) => [a.id, a.scale]));
}

function say(text) {
  document.getElementById("adapter-msg").textContent = text;
}

/** Names and ids of the loaded adapters. */
export function adapterList() {
  return adapters.map(({ id, name }) => ({ id, name }));
}

/** The adapter's name for an id (the id itself once unloaded). */
export function nameOf(id) {
  const a = adapters.find((x) => x.id === id);
  return a ? a.name : `#${id}`;
}

/** "name 1.00, other 0.50" for `[{id, scale}]`; zero scales are left out. */
export function mixOf(lora) {
  const on = lora.filter((x) => x.scale !== 0);
  if (!on.length) return "none (base model)";
  return on.map((x) => `${nameOf(x.id)} ${fmt(x.scale)}`).join(", ");
}

/** The request's `lora` field: every adapter's scale here, or none (server default). */
export function requestLora() {
  if (target === "server") return undefined;
  return adapters.map((a) => ({ id: a.id, scale: mine.get(a.id) ?? 0 }));
}

/** The mix the next request runs under, as text. */
export function currentMix() {
  const m = shown();
  return mixOf(adapters.map((a) => ({ id: a.id, scale: m.get(a.id) ?? 0 })));
}

/** This conversation's scales by adapter name (kept with the conversation). */
export function conversationMix() {
  return Object.fromEntries(adapters.map((a) => [a.name, mine.get(a.id) ?? 0]));
}

/** Restore a conversation's scales (by name; adapters it does not name go to 0). */
export function setConversationMix(byName) {
  for (const a of adapters) mine.set(a.id, Number((byName || {})[a.name] ?? 0));
  build();
}

async function pushServer() {
  const body = adapters.map((a) => ({ id: a.id, scale: a.scale }));
  try {
    await json("/lora-adapters", { method: "POST", body });
    say(`server default: ${mixOf(body)}`);
  } catch (e) {
    say(`could not set the server default: ${e.message}`);
  }
}

function setScale(id, value) {
  const x = Math.max(-2, Math.min(2, Number(value) || 0));
  if (target === "server") {
    const a = adapters.find((y) => y.id === id);
    if (a) a.scale = x;
  } else {
    mine.set(id, x);
  }
  return x;
}

function row(a, value) {
  const div = document.createElement("div");
  div.className = "adapter";
  const label = document.createElement("label");
  label.htmlFor = `lora-${a.id}`;
  label.textContent = a.name;
  label.title = a.path;
  const range = document.createElement("input");
  Object.assign(range, { type: "range", id: `lora-${a.id}`, min: -2, max: 2, step: 0.05 });
  const num = document.createElement("input");
  Object.assign(num, { type: "number", min: -2, max: 2, step: 0.05, className: "scale" });
  num.setAttribute("aria-label", `${a.name} scale`);
  range.value = num.value = fmt(value);
  range.addEventListener("input", () => {
    num.value = fmt(setScale(a.id, range.value));
    changed();
  });
  num.addEventListener("change", () => {
    range.value = num.value = fmt(setScale(a.id, num.value));
    changed();
    if (target === "server") pushServer();
  });
  range.addEventListener("change", () => target === "server" && pushServer());
  const unload = document.createElement("button");
  unload.type = "button";
  unload.textContent = "×";
  unload.setAttribute("aria-label", `Unload ${a.name}`);
  unload.addEventListener("click", () => unloadAdapter(a));
  div.append(label, range, num, unload);
  return div;
}

function build() {
  const box = document.getElementById("adapters");
  const m = shown();
  box.replaceChildren(...adapters.map((a) => row(a, m.get(a.id) ?? 0)));
  if (!adapters.length) box.textContent = "No adapters loaded.";
  document.getElementById("target-help").textContent =
    target === "server"
      ? "Sliders set the server's default mix (POST /lora-adapters); requests send no lora field."
      : "Sliders set this conversation's mix, sent as each request's lora field.";
}

/** Fetch the adapter list and rebuild the sliders. */
export async function refreshAdapters() {
  adapters = await json("/lora-adapters");
  for (const a of adapters) if (!mine.has(a.id)) mine.set(a.id, 0);
  build();
}

async function unloadAdapter(a) {
  try {
    await json("/lora-adapters/unload", { method: "POST", body: { id: a.id } });
    say(`unloaded ${a.name}`);
    await refreshAdapters();
    changed();
  } catch (e) {
    say(`could not unload ${a.name}: ${e.message}`);
  }
}

async function loadAdapter(ev) {
  ev.preventDefault();
  const path = ev.target.elements.path.value.trim();
  if (!path) return;
  try {
    const a = await json("/lora-adapters/load", { method: "POST", body: { path, scale: 0 } });
    say(`loaded ${a.name} as #${a.id}`);
    ev.target.reset();
    await refreshAdapters();
  } catch (e) {
    say(e.status === 501 ? "This server does not load adapters at run time (start it with --lora-dir DIR)." : e.message);
  }
}

/** Wire the panel; `onChange` runs whenever the mix changes. */
export function initAdapters(onChange) {
  changed = onChange;
  for (const radio of document.querySelectorAll('input[name="target"]')) {
    radio.checked = radio.value === target;
    radio.addEventListener("change", () => {
      target = radio.value;
      localStorage.setItem(TARGET, target);
      build();
      changed();
    });
  }
  document.getElementById("load-form").addEventListener("submit", loadAdapter);
}
