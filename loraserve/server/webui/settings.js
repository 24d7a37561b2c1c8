// The sampling settings panel: one number field per request field, prefilled with the
// server's defaults (GET /props), the user's changes kept in localStorage.

const KEY = "loraserve.settings";
const FIELDS = [
  ["temperature", "temperature", 0.05],
  ["top_k", "top_k", 1],
  ["top_p", "top_p", 0.01],
  ["min_p", "min_p", 0.01],
  ["repeat_penalty", "repeat penalty", 0.05],
  ["repeat_last_n", "repeat last n", 1],
  ["presence_penalty", "presence penalty", 0.05],
  ["frequency_penalty", "frequency penalty", 0.05],
  ["n_predict", "n_predict (max tokens)", 1],
  ["seed", "seed (-1 random)", 1],
];
const UI_N_PREDICT = 128; // when the server's default is -1 (no limit)
let defaults = {};

function saved() {
  try {
    return JSON.parse(localStorage.getItem(KEY)) || {};
  } catch {
    return {};
  }
}

function fill() {
  const mine = saved();
  for (const [name] of FIELDS) {
    const input = document.getElementById(`set-${name}`);
    input.value = mine[name] ?? defaults[name] ?? "";
  }
}

/** Build the panel from the server's default generation settings. */
export function initSettings(serverParams) {
  defaults = { ...serverParams };
  if (!(defaults.n_predict > 0)) defaults.n_predict = UI_N_PREDICT;
  const form = document.getElementById("settings");
  form.replaceChildren();
  for (const [name, label, step] of FIELDS) {
    const l = document.createElement("label");
    l.textContent = label;
    const input = document.createElement("input");
    Object.assign(input, { type: "number", id: `set-${name}`, name, step, inputMode: "decimal" });
    input.addEventListener("change", () => {
      const mine = saved();
      if (input.value === "") delete mine[name];
      else mine[name] = Number(input.value);
      localStorage.setItem(KEY, JSON.stringify(mine));
    });
    l.append(input);
    form.append(l);
  }
  form.addEventListener("submit", (e) => e.preventDefault());
  document.getElementById("settings-reset").onclick = () => {
    localStorage.removeItem(KEY);
    fill();
  };
  fill();
}

/** The sampling fields of the next request (empty fields left to the server). */
export function samplingParams() {
  const out = {};
  for (const [name] of FIELDS) {
    const v = document.getElementById(`set-${name}`).value;
    if (v !== "" && isFinite(Number(v))) out[name] = Number(v);
  }
  return out;
}
