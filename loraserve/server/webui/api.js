// HTTP to this server: JSON calls and server-sent events, with the --api-key kept in
// localStorage. On a 401 the page asks for the key (one dialog, however many calls wait).

const KEY = "loraserve.apiKey";
let asking = null;

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

let routed = null; // router mode: the model (or preset) every call names

/** Router mode: name `model` in every call from now on (GET `?model=`, POST bodies). */
export function setRoutedModel(model) {
  routed = model;
}

function route(path, body) {
  if (!routed || path.startsWith("/models")) return [path, body];
  if (body === undefined) {
    return [`${path}${path.includes("?") ? "&" : "?"}model=${encodeURIComponent(routed)}`, body];
  }
  return [path, { model: routed, ...body }];
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = localStorage.getItem(KEY);
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

function askKey(refused) {
  if (asking) return asking;
  const dialog = document.getElementById("key-dialog");
  const input = document.getElementById("key-input");
  document.getElementById("key-error").hidden = !refused;
  input.value = "";
  asking = new Promise((resolve) => {
    dialog.addEventListener(
      "close",
      () => {
        if (input.value) localStorage.setItem(KEY, input.value.trim());
        asking = null;
        resolve();
      },
      { once: true },
    );
  });
  dialog.showModal();
  input.focus();
  return asking;
}

/** fetch() with the key; a 401 asks for it (again, saying it was refused) and retries. */
export async function request(path, { method = "GET", body, signal } = {}) {
  [path, body] = route(path, body);
  for (let attempt = 0; ; attempt++) {
    const init = { method, headers: headers(), signal };
    if (body !== undefined) init.body = JSON.stringify(body);
    const r = await fetch(path, init);
    if (r.status !== 401 || attempt >= 5) return r;
    await askKey(attempt > 0 || Boolean(localStorage.getItem(KEY)));
  }
}

async function failure(r) {
  const data = await r.json().catch(() => null);
  const msg = data && data.error ? data.error.message : `${r.status} ${r.statusText}`;
  return new ApiError(r.status, msg);
}

/** A JSON call; non-2xx answers throw an ApiError with the server's message. */
export async function json(path, opts) {
  const r = await request(path, opts);
  if (!r.ok) throw await failure(r);
  return r.json();
}

/** POST `body` with streaming and yield each `data:` event's JSON (until `[DONE]`). */
export async function* sse(path, body, signal) {
  const r = await request(path, { method: "POST", body, signal });
  if (!r.ok) throw await failure(r);
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let end;
    while ((end = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, end);
      buf = buf.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        const obj = JSON.parse(data);
        if (obj.error) throw new ApiError(obj.error.code || 500, obj.error.message);
        yield obj;
      }
    }
  }
}
