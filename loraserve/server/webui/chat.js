// Chat mode: /v1/chat/completions streamed, with stop, regenerate, edit and resend, and the
// conversations (and each one's adapter mix) kept in localStorage.

import { sse } from "./api.js";
import { apiMessage, MAX_STEPS, runToolCall, toolDefinitions } from "./agent.js";
import { conversationMix, currentMix, requestLora, setConversationMix } from "./adapters.js";
import { renderInfo, renderMarkdown } from "./render.js";
import { samplingParams } from "./settings.js";
import { store } from "./store.js";

const $ = (id) => document.getElementById(id);
let controller = null;
let editing = -1; // index of the user message being edited, or -1

function button(text, label, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = text;
  b.setAttribute("aria-label", label);
  b.addEventListener("click", onClick);
  return b;
}

function messageItem(m, i) {
  const li = document.createElement("li");
  li.className = `msg ${m.role}`;
  const role = document.createElement("div");
  role.className = "role";
  role.textContent = m.role === "user" ? "you" : m.role === "tool" ? `tool ${m.name}` : "model";
  const content = document.createElement("div");
  content.className = "content";
  renderMarkdown(content, m.content);
  const info = document.createElement("p");
  info.className = "info";
  renderInfo(info, m.info);
  li.append(role, content, info);
  renderExtras(li, m);
  if (m.role === "user") li.append(button("Edit", `Edit message ${i + 1}`, () => edit(i)));
  return li;
}

/** A model message's reasoning (folded) above its text, and its tool calls below it. */
function renderExtras(li, m) {
  const content = li.querySelector(".content");
  if (m.reasoning) {
    let box = li.querySelector("details.reasoning");
    if (!box) {
      box = document.createElement("details");
      box.className = "reasoning";
      const summary = document.createElement("summary");
      summary.textContent = "Reasoning";
      box.append(summary, document.createElement("div"));
      li.insertBefore(box, content);
    }
    box.lastElementChild.textContent = m.reasoning;
  }
  if (m.tool_calls?.length) {
    let pre = li.querySelector("pre.tool-calls");
    if (!pre) {
      pre = document.createElement("pre");
      pre.className = "tool-calls";
      content.after(pre);
    }
    pre.textContent = m.tool_calls.map((t) => `${t.name}(${t.arguments})`).join("\n");
  }
}

function renderList() {
  const ul = $("conversations");
  ul.replaceChildren();
  for (const c of store.list) {
    const li = document.createElement("li");
    const open = button(c.title, `Open conversation ${c.title}`, () => openConversation(c.id));
    if (c.id === store.currentId) open.setAttribute("aria-current", "true");
    li.append(open, button("×", `Delete conversation ${c.title}`, () => remove(c.id)));
    ul.append(li);
  }
}

function renderMessages() {
  const c = store.current();
  $("messages").replaceChildren(...c.messages.map(messageItem));
  renderList();
}

function openConversation(id) {
  store.open(id);
  setConversationMix(store.current().mix);
  renderMessages();
}

function remove(id) {
  store.remove(id);
  openConversation(store.current().id);
}

function edit(i) {
  editing = i;
  const input = $("chat-input");
  input.value = store.current().messages[i].content;
  input.placeholder = `Editing message ${i + 1}: Send replaces it and what follows (Esc cancels)`;
  input.focus();
}

function busy(on) {
  $("chat-send").disabled = on;
  $("chat-regen").disabled = on;
  $("chat-stop").disabled = !on;
}

/** Stream the assistant's answer to the open conversation's messages; with the server's
 * tools, run the calls it makes and answer again (`step`: the round of the agent loop). */
async function generate(step = 0) {
  const c = store.current();
  const history = c.messages.map(apiMessage);
  // busy before the first await: a Send or Regenerate while the tool list loads would
  // otherwise start a second answer on the same conversation and lose one of them
  controller = new AbortController();
  busy(true);
  const tools = await toolDefinitions();
  const m = { role: "assistant", content: "", info: null };
  c.messages.push(m);
  renderMessages();
  const li = $("messages").lastElementChild;
  const content = li.querySelector(".content");
  const infoEl = li.querySelector(".info");
  li.setAttribute("aria-busy", "true");
  const body = { messages: history, stream: true, stream_options: { include_usage: true }, ...samplingParams() };
  const lora = requestLora();
  if (lora) body.lora = lora;
  if (tools.length) body.tools = tools;
  const info = { mix: currentMix(), measured: true };
  const t0 = performance.now();
  let tFirst = null;
  let usage = null;
  try {
    for await (const chunk of sse("/v1/chat/completions", body, controller.signal)) {
      const d = chunk.choices?.[0]?.delta ?? {};
      const delta = d.content;
      if (delta) {
        tFirst ??= performance.now();
        m.content += delta;
        renderMarkdown(content, m.content);
      }
      if (d.reasoning_content || d.tool_calls) {
        tFirst ??= performance.now();
        m.reasoning = (m.reasoning ?? "") + (d.reasoning_content ?? "");
        for (const t of d.tool_calls ?? []) {
          m.tool_calls ??= [];
          const call = (m.tool_calls[t.index] ??= { name: "", arguments: "" });
          if (t.id) call.id = t.id;
          if (t.function?.name) call.name = t.function.name;
          call.arguments += t.function?.arguments ?? "";
        }
        renderExtras(li, m);
      }
      if (chunk.usage) usage = chunk.usage;
      if (chunk.timings) Object.assign(info, chunk.timings, { measured: false });
      if (chunk.id_slot !== undefined) info.slot = chunk.id_slot;
      if (chunk.choices?.[0]?.finish_reason) info.stop = `finish: ${chunk.choices[0].finish_reason}`;
    }
  } catch (e) {
    info.stop = e.name === "AbortError" ? "stopped" : `error: ${e.message}`;
  } finally {
    controller = null;
    busy(false);
    li.removeAttribute("aria-busy");
  }
  const tEnd = performance.now();
  if (usage && info.measured) {
    const cached = usage.prompt_tokens_details?.cached_tokens ?? 0;
    info.cache_n = cached;
    info.prompt_n = usage.prompt_tokens - cached;
    if (tFirst) {
      info.prompt_per_second = (info.prompt_n / (tFirst - t0)) * 1000;
      const n = usage.completion_tokens - 1;
      if (n > 0 && tEnd > tFirst) info.predicted_per_second = (n / (tEnd - tFirst)) * 1000;
    }
  }
  m.info = info;
  renderInfo(infoEl, info);
  store.save();
  if (tools.length && m.tool_calls?.length && step < MAX_STEPS && !info.stop?.startsWith("error")
      && info.stop !== "stopped") {
    for (const [i, call] of m.tool_calls.entries()) {
      call.id ??= `call_${i}`;
      const content = await runToolCall(call);
      c.messages.push({ role: "tool", name: call.name, tool_call_id: call.id, content, info: null });
      renderMessages();
    }
    store.save();
    await generate(step + 1);
  }
}

async function send(ev) {
  ev.preventDefault();
  const input = $("chat-input");
  const text = input.value.trim();
  if (!text || controller) return;
  const c = store.current();
  if (editing >= 0) c.messages.length = editing;
  editing = -1;
  input.placeholder = "Message (Enter sends, Shift+Enter: new line, Esc stops)";
  if (!c.messages.length) c.title = text.slice(0, 40);
  c.mix = conversationMix();
  c.messages.push({ role: "user", content: text, info: null });
  input.value = "";
  await generate();
}

function regenerate() {
  const c = store.current();
  if (controller || !c.messages.length) return;
  if (c.messages.at(-1).role === "assistant") c.messages.pop();
  if (c.messages.length) generate();
}

/** Stop the answer being streamed, if any. */
export function stopChat() {
  if (controller) controller.abort();
}

/** Wire chat mode and show the open conversation. */
export function initChat() {
  $("chat-form").addEventListener("submit", send);
  $("chat-stop").addEventListener("click", stopChat);
  $("chat-regen").addEventListener("click", regenerate);
  $("new-chat").addEventListener("click", () => openConversation(store.create().id));
  $("chat-input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("chat-form").requestSubmit();
    } else if (e.key === "Escape" && editing >= 0) {
      editing = -1;
      e.target.value = "";
    }
  });
  openConversation(store.current().id);
}

/** Keep the open conversation's mix when the sliders move. */
export function rememberMix() {
  store.current().mix = conversationMix();
  store.save();
}
