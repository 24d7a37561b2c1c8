"""Record llama.cpp's rendering of its built-in chat templates as test data.

Calls `llama_chat_apply_template` of the peer's libllama.so (ctypes; no model needed) for
every built-in name loraserve ports (`loraserve.chat.builtin.BUILTIN`, minus the
names that are ours) over a few conversations, with and without the assistant header, and
writes tests/data/chat_templates.json.

    python scripts/record_chat_templates.py [--lib PATH/libllama.so]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.peer import find_peer  # noqa: E402
from loraserve.chat.builtin import BUILTIN  # noqa: E402

OUT = ROOT / "tests" / "data" / "chat_templates.json"
OURS = {"qwen"}  # names llama.cpp does not have
CONVERSATIONS = [
    [{"role": "user", "content": "Hello"}],
    [
        {"role": "system", "content": "  You are terse.\n"},
        {"role": "user", "content": " What is 2+2? "},
    ],
    [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "  Hello! How can I help?  "},
        {"role": "user", "content": "Tell me a joke.\n\n"},
    ],
    [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "second"},
        {"role": "tool", "content": "tool output"},
        {"role": "user", "content": "ünïcödé ✓"},
    ],
]


class Message(ctypes.Structure):
    _fields_ = [("role", ctypes.c_char_p), ("content", ctypes.c_char_p)]


def render(lib: ctypes.CDLL, name: str, chat: list[dict], add_ass: bool) -> str:
    msgs = (Message * len(chat))(
        *[Message(m["role"].encode(), m["content"].encode()) for m in chat]
    )
    n = lib.llama_chat_apply_template(name.encode(), msgs, len(chat), add_ass, None, 0)
    if n < 0:
        raise RuntimeError(f"llama.cpp does not know the template {name!r}")
    buf = ctypes.create_string_buffer(n + 1)
    lib.llama_chat_apply_template(name.encode(), msgs, len(chat), add_ass, buf, n + 1)
    return buf.raw[:n].decode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lib", type=Path, default=None, help="libllama.so (default: the peer's)")
    args = ap.parse_args()
    lib_path = args.lib
    if lib_path is None:
        peer = find_peer()
        if peer is None:
            sys.exit("no llama-server found (see bench/peer.py); pass --lib")
        lib_path = peer.with_name("libllama.so")
    lib = ctypes.CDLL(str(lib_path))
    lib.llama_chat_apply_template.restype = ctypes.c_int32
    lib.llama_chat_apply_template.argtypes = [
        ctypes.c_char_p, ctypes.POINTER(Message), ctypes.c_size_t, ctypes.c_bool,
        ctypes.c_char_p, ctypes.c_int32,
    ]  # fmt: skip
    cases = [
        {
            "name": name,
            "messages": chat,
            "add_ass": add_ass,
            "prompt": render(lib, name, chat, add_ass),
        }
        for name in sorted(set(BUILTIN) - OURS)
        for chat in CONVERSATIONS
        for add_ass in (True, False)
    ]
    OUT.write_text(
        json.dumps({"source": str(lib_path), "cases": cases}, indent=1, ensure_ascii=False)
    )
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
