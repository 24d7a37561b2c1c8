// Model output to DOM, safely: a small markdown subset (fenced code, headings, lists,
// paragraphs, inline code, bold, italics) built with createElement and text nodes only.
// Nothing the model writes is ever parsed as HTML.

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

const INLINE = /(`[^`\n]+`|\*\*[^*\n]+\*\*|\*[^*\n]+\*)/;

function inline(parent, text) {
  for (const part of text.split(INLINE)) {
    if (!part) continue;
    if (part.length > 2 && part.startsWith("`") && part.endsWith("`")) {
      parent.append(el("code", "", part.slice(1, -1)));
    } else if (part.length > 4 && part.startsWith("**") && part.endsWith("**")) {
      parent.append(el("strong", "", part.slice(2, -2)));
    } else if (part.length > 2 && part.startsWith("*") && part.endsWith("*")) {
      parent.append(el("em", "", part.slice(1, -1)));
    } else {
      parent.append(document.createTextNode(part));
    }
  }
}

function block(parent, lines) {
  let list = null;
  let para = null;
  for (const line of lines) {
    const item = /^\s*(?:[-*+]|\d+\.)\s+(.*)$/.exec(line);
    const head = /^(#{1,6})\s+(.*)$/.exec(line);
    if (item) {
      para = null;
      if (!list) parent.append((list = el(/^\s*\d/.test(line) ? "ol" : "ul")));
      const li = el("li");
      inline(li, item[1]);
      list.append(li);
    } else if (head) {
      list = para = null;
      const h = el(`h${Math.min(head[1].length + 2, 6)}`);
      inline(h, head[2]);
      parent.append(h);
    } else if (!line.trim()) {
      list = para = null;
    } else {
      list = null;
      if (para) para.append(el("br"));
      else parent.append((para = el("p")));
      inline(para, line);
    }
  }
}

/** Replace `target`'s children by `text` rendered as markdown (an unclosed fence is code). */
export function renderMarkdown(target, text) {
  target.replaceChildren();
  const lines = text.split("\n");
  let prose = [];
  for (let i = 0; i < lines.length; i++) {
    const fence = /^```\s*([\w+-]*)/.exec(lines[i]);
    if (!fence) {
      prose.push(lines[i]);
      continue;
    }
    block(target, prose);
    prose = [];
    const code = [];
    for (i++; i < lines.length && !lines[i].startsWith("```"); i++) code.push(lines[i]);
    const pre = el("pre");
    const c = el("code", "", code.join("\n"));
    if (fence[1]) c.dataset.lang = fence[1];
    pre.append(c);
    target.append(pre);
  }
  block(target, prose);
}

function rate(x) {
  return typeof x === "number" && isFinite(x) ? `${x.toFixed(1)} tok/s` : "n/a";
}

/**
 * The "what happened" line under an answer. `info`: {cache_n, prompt_n, prompt_per_second,
 * predicted_per_second, slot, mix, measured} (measured: rates timed by the browser).
 */
export function renderInfo(target, info) {
  target.replaceChildren();
  if (!info) return;
  const parts = [
    ["cache", `prompt: ${info.prompt_n ?? "?"} evaluated, ${info.cache_n ?? "?"} from cache`],
    ["pp", `prompt ${rate(info.prompt_per_second)}`],
    ["tg", `generation ${rate(info.predicted_per_second)}${info.measured ? " (browser-timed)" : ""}`],
    ["slot", `slot ${info.slot ?? "n/a"}`],
    ["mix", `mix: ${info.mix || "none"}`],
  ];
  for (const [cls, text] of parts) target.append(el("span", `info-${cls}`, text));
  if (info.stop) target.append(el("span", "info-stop", info.stop));
}

/** `info` from /completion's final event (llama-server's timings, id_slot, echo). */
export function completionInfo(final, mixOf) {
  const t = final.timings || {};
  return {
    cache_n: t.cache_n,
    prompt_n: t.prompt_n,
    prompt_per_second: t.prompt_per_second,
    predicted_per_second: t.predicted_per_second,
    slot: final.id_slot,
    mix: mixOf((final.generation_settings || {}).lora || []),
    stop: final.stop_type && final.stop_type !== "none" ? `stop: ${final.stop_type}` : "",
  };
}
