// Compare mode: one prompt answered under two or more mixes side by side, all streamed at
// once. The server batches different mixes in one forward pass; the summary shows how long
// the streams ran together and in which slots.

import { adapterList, requestLora } from "./adapters.js";
import { streamCompletion } from "./completion.js";
import { renderInfo } from "./render.js";

const $ = (id) => document.getElementById(id);
let mixes = []; // [{scales: Map(id -> scale)}]
let controller = null;

function column(mix, i) {
  const col = document.createElement("section");
  col.className = "column";
  col.setAttribute("aria-label", `Mix ${i + 1}`);
  const head = document.createElement("h2");
  head.textContent = `Mix ${i + 1}`;
  col.append(head);
  for (const a of adapterList()) {
    const l = document.createElement("label");
    l.className = "mix-scale";
    l.textContent = a.name;
    const input = document.createElement("input");
    Object.assign(input, { type: "number", min: -2, max: 2, step: 0.05 });
    input.value = (mix.scales.get(a.id) ?? 0).toFixed(2);
    input.setAttribute("aria-label", `Mix ${i + 1} ${a.name}`);
    input.addEventListener("change", () => {
      const x = Math.max(-2, Math.min(2, Number(input.value) || 0));
      mix.scales.set(a.id, x);
      input.value = x.toFixed(2);
    });
    l.append(input);
    col.append(l);
  }
  if (mixes.length > 2) {
    const rm = document.createElement("button");
    rm.type = "button";
    rm.textContent = "Remove";
    rm.setAttribute("aria-label", `Remove mix ${i + 1}`);
    rm.addEventListener("click", () => {
      mixes.splice(i, 1);
      build();
    });
    col.append(rm);
  }
  const out = document.createElement("p");
  out.className = "output";
  const info = document.createElement("p");
  info.className = "info";
  col.append(out, info);
  return col;
}

function build() {
  $("compare-columns").replaceChildren(...mixes.map(column));
}

function fromSliders() {
  const lora = requestLora() || [];
  return { scales: new Map(lora.map((x) => [x.id, x.scale])) };
}

/** Rebuild the columns for the loaded adapters (first mix: the sliders; second: none). */
export function refreshCompare() {
  if (mixes.length < 2) mixes = [fromSliders(), { scales: new Map() }];
  build();
}

async function runAll(ev) {
  ev.preventDefault();
  if (controller) return;
  const prompt = $("compare-input").value;
  const cols = [...$("compare-columns").children];
  controller = new AbortController();
  $("compare-run").disabled = true;
  $("compare-stop").disabled = false;
  $("compare-summary").textContent = `streaming ${mixes.length} mixes at once…`;
  const t0 = performance.now();
  const runs = mixes.map(async (mix, i) => {
    const out = cols[i].querySelector(".output");
    const infoEl = cols[i].querySelector(".info");
    out.replaceChildren();
    renderInfo(infoEl, null);
    const lora = adapterList().map((a) => ({ id: a.id, scale: mix.scales.get(a.id) ?? 0 }));
    const span = { first: null, end: null, slot: null };
    try {
      const info = await streamCompletion(
        prompt,
        lora,
        (text) => {
          span.first ??= performance.now();
          out.append(document.createTextNode(text));
        },
        controller.signal,
      );
      span.slot = info?.slot;
      renderInfo(infoEl, info);
    } catch (e) {
      renderInfo(infoEl, { stop: e.name === "AbortError" ? "stopped" : `error: ${e.message}` });
    }
    span.end = performance.now();
    return span;
  });
  const spans = await Promise.all(runs);
  controller = null;
  $("compare-run").disabled = false;
  $("compare-stop").disabled = true;
  const firsts = spans.map((s) => s.first).filter((x) => x !== null);
  const together = firsts.length === spans.length ? Math.min(...spans.map((s) => s.end)) - Math.max(...firsts) : 0;
  const slots = spans.map((s) => s.slot ?? "?").join(", ");
  const total = Math.max(...spans.map((s) => s.end)) - t0;
  $("compare-summary").textContent =
    together > 0
      ? `${spans.length} mixes streamed in parallel (slots ${slots}): all were generating together for ${together.toFixed(0)} ms of ${total.toFixed(0)} ms, the server batching the different mixes in one forward pass per step.`
      : `${spans.length} mixes done in ${total.toFixed(0)} ms (slots ${slots}); they did not overlap (one slot, or one answer was very short).`;
}

/** Wire compare mode. */
export function initCompare() {
  $("compare-form").addEventListener("submit", runAll);
  $("compare-stop").addEventListener("click", () => controller && controller.abort());
  $("compare-add").addEventListener("click", () => {
    mixes.push(fromSliders());
    build();
  });
}
