// The chat's agent loop over the server's tools (`--tools`, MCP servers: GET /tools). When
// the server has tools their definitions go with every chat request; each tool call the
// model makes is run with POST /tools and its answer sent back as a `tool` message, until
// the model answers without calls (at most MAX_STEPS rounds per question).

import { json } from "./api.js";

export const MAX_STEPS = 8;
let tools = null; // the server's tools once asked ([] when it has none or refuses: 403)

/** The OpenAI function definitions of the server's tools ([] when it serves none). */
export async function toolDefinitions() {
  if (tools === null) {
    try {
      tools = await json("/tools");
    } catch {
      tools = [];
    }
  }
  return tools.map((t) => t.definition);
}

/** Run one call ({name, arguments}) on the server; the text the model gets back. */
export async function runToolCall(call) {
  let params;
  try {
    params = call.arguments ? JSON.parse(call.arguments) : {};
  } catch (e) {
    return `error: the arguments are not JSON (${e.message})`;
  }
  try {
    const out = await json("/tools", { method: "POST", body: { tool: call.name, params } });
    if (out.error) return `error: ${out.error}`;
    return out.plain_text_response ?? JSON.stringify(out);
  } catch (e) {
    return `error: ${e.message}`;
  }
}

/** A stored message as the chat API takes it (calls with their ids, tool answers). */
export function apiMessage(m) {
  if (m.role === "tool") return { role: "tool", tool_call_id: m.tool_call_id, content: m.content };
  const out = { role: m.role, content: m.content };
  if (m.tool_calls?.length) {
    out.tool_calls = m.tool_calls.map((t, i) => ({
      id: t.id ?? `call_${i}`,
      type: "function",
      function: { name: t.name, arguments: t.arguments },
    }));
  }
  return out;
}
