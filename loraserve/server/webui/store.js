// Conversations kept in localStorage: [{id, title, messages: [{role, content, info}], mix}].

const KEY = "loraserve.conversations";
const CURRENT = "loraserve.current";

function load() {
  try {
    const list = JSON.parse(localStorage.getItem(KEY));
    return Array.isArray(list) ? list : [];
  } catch {
    return [];
  }
}

export const store = {
  list: load(),
  currentId: localStorage.getItem(CURRENT),

  /** The open conversation (a new empty one if there is none). */
  current() {
    let c = this.list.find((x) => x.id === this.currentId);
    if (!c) c = this.create();
    return c;
  },

  create() {
    const c = { id: `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`, title: "New conversation", messages: [], mix: {} };
    this.list.unshift(c);
    this.open(c.id);
    return c;
  },

  open(id) {
    this.currentId = id;
    localStorage.setItem(CURRENT, id);
  },

  remove(id) {
    this.list = this.list.filter((x) => x.id !== id);
    if (this.currentId === id) this.currentId = this.list[0]?.id ?? null;
    this.save();
  },

  save() {
    localStorage.setItem(KEY, JSON.stringify(this.list));
    if (this.currentId) localStorage.setItem(CURRENT, this.currentId);
  },
};
