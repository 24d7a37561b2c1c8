"""llama.cpp's built-in chat templates (`--chat-template NAME`), rendered as its C++
`llm_chat_apply_template` (src/llama-chat.cpp) renders them, string for string.

Each renderer takes the messages (role and text content) and `add_ass` (end with the
assistant's turn header) and returns the prompt text; none adds BOS (the tokenizer does).
**Ours:** `qwen` names ChatML (Qwen 2 and 3 chat in ChatML; llama.cpp has no such name).
Names llama.cpp has that are not ported here are refused with a message that says so
(`UNPORTED`), so a command line never silently renders something else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Msgs = Sequence[dict[str, Any]]
Renderer = Callable[[Msgs, bool], str]

_WS = " \t\n\v\f\r"  # C isspace


def _trim(s: str) -> str:
    return s.strip(_WS)


def _chatml(chat: Msgs, add_ass: bool) -> str:
    out = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in chat)
    return out + ("<|im_start|>assistant\n" if add_ass else "")


def _mistral_v7(tekken: bool) -> Renderer:
    sp = "" if tekken else " "

    def render(chat: Msgs, add_ass: bool) -> str:
        out = ""
        for m in chat:
            if m["role"] == "system":
                out += f"[SYSTEM_PROMPT]{sp}{m['content']}[/SYSTEM_PROMPT]"
            elif m["role"] == "user":
                out += f"[INST]{sp}{m['content']}[/INST]"
            else:
                out += f"{sp}{m['content']}</s>"
        return out

    return render


def _mistral_v1_v3(lead: str, trail: str, trim_assistant: bool) -> Renderer:
    def render(chat: Msgs, add_ass: bool) -> str:
        out, inside = "", False
        for m in chat:
            if not inside:
                out += f"{lead}[INST]{trail}"
                inside = True
            if m["role"] == "system":
                out += m["content"] + "\n\n"
            elif m["role"] == "user":
                out += m["content"] + lead + "[/INST]"
            else:
                content = _trim(m["content"]) if trim_assistant else m["content"]
                out += f"{trail}{content}</s>"
                inside = False
        return out

    return render


def _llama2(system: bool, bos_inside: bool, strip: bool) -> Renderer:
    def render(chat: Msgs, add_ass: bool) -> str:
        out, inside = "[INST] ", True
        for m in chat:
            content = _trim(m["content"]) if strip else m["content"]
            if not inside:
                inside = True
                out += "<s>[INST] " if bos_inside else "[INST] "
            if m["role"] == "system":
                out += f"<<SYS>>\n{content}\n<</SYS>>\n\n" if system else content + "\n"
            elif m["role"] == "user":
                out += content + " [/INST]"
            else:
                out += content + "</s>"
                inside = False
        return out

    return render


def _headers(open_: str, close: str, end: str, tail: str) -> Renderer:
    """Templates of the form OPEN role CLOSE content END for every message."""

    def render(chat: Msgs, add_ass: bool) -> str:
        out = "".join(f"{open_}{m['role']}{close}{m['content']}{end}" for m in chat)
        return out + (tail if add_ass else "")

    return render


def _monarch(chat: Msgs, add_ass: bool) -> str:
    out = "".join(
        ("" if i == 0 else "<s>") + f"{m['role']}\n{m['content']}</s>\n" for i, m in enumerate(chat)
    )
    return out + ("<s>assistant\n" if add_ass else "")


def _gemma(chat: Msgs, add_ass: bool) -> str:
    out, system = "", ""
    for m in chat:
        if m["role"] == "system":
            system += _trim(m["content"])  # no system turn in Gemma: merged into the next user's
            continue
        role = "model" if m["role"] == "assistant" else m["role"]
        out += f"<start_of_turn>{role}\n"
        if system and role != "model":
            out += system + "\n\n"
            system = ""
        out += _trim(m["content"]) + "<end_of_turn>\n"
    return out + ("<start_of_turn>model\n" if add_ass else "")


def _orion(chat: Msgs, add_ass: bool) -> str:
    out, system = "", ""
    for m in chat:
        if m["role"] == "system":
            system += m["content"]
        elif m["role"] == "user":
            out += "Human: "
            if system:
                out += system + "\n\n"
                system = ""
            out += m["content"] + "\n\nAssistant: </s>"
        else:
            out += m["content"] + "</s>"
    return out


def _openchat(chat: Msgs, add_ass: bool) -> str:
    out = ""
    for m in chat:
        role = m["role"]
        if role == "system":
            out += m["content"] + "<|end_of_turn|>"
        else:
            role = role[:1].upper() + role[1:]
            out += f"GPT4 Correct {role}: {m['content']}<|end_of_turn|>"
    return out + ("GPT4 Correct Assistant:" if add_ass else "")


def _vicuna(orca: bool) -> Renderer:
    def render(chat: Msgs, add_ass: bool) -> str:
        out = ""
        for m in chat:
            if m["role"] == "system":
                out += f"SYSTEM: {m['content']}\n" if orca else m["content"] + "\n\n"
            elif m["role"] == "user":
                out += f"USER: {m['content']}\n"
            elif m["role"] == "assistant":
                out += f"ASSISTANT: {m['content']}</s>\n"
        return out + ("ASSISTANT:" if add_ass else "")

    return render


def _by_role(parts: dict[str, tuple[str, str]], tail: str, trim: bool = False) -> Renderer:
    """Templates that wrap each known role's content in a prefix and suffix (other roles
    are dropped, as in llama.cpp)."""

    def render(chat: Msgs, add_ass: bool) -> str:
        out = ""
        for m in chat:
            if m["role"] in parts:
                pre, post = parts[m["role"]]
                out += pre + (_trim(m["content"]) if trim else m["content"]) + post
        return out + (tail if add_ass else "")

    return render


def _minicpm(chat: Msgs, add_ass: bool) -> str:
    out = ""
    for m in chat:
        out += f"<用户>{_trim(m['content'])}<AI>" if m["role"] == "user" else _trim(m["content"])
    return out


_EOS_DS = "<｜end▁of▁sentence｜>"
_COHERE = "<|START_OF_TURN_TOKEN|>"

BUILTIN: dict[str, Renderer] = {
    "chatml": _chatml,
    "qwen": _chatml,
    "llama2": _llama2(system=False, bos_inside=False, strip=False),
    "llama2-sys": _llama2(system=True, bos_inside=False, strip=False),
    "llama2-sys-bos": _llama2(system=True, bos_inside=True, strip=False),
    "llama2-sys-strip": _llama2(system=True, bos_inside=False, strip=True),
    "mistral-v1": _mistral_v1_v3(" ", " ", trim_assistant=False),
    "mistral-v3": _mistral_v1_v3("", " ", trim_assistant=True),
    "mistral-v3-tekken": _mistral_v1_v3("", "", trim_assistant=False),
    "mistral-v7": _mistral_v7(tekken=False),
    "mistral-v7-tekken": _mistral_v7(tekken=True),
    "phi3": _headers("<|", "|>\n", "<|end|>\n", "<|assistant|>\n"),
    "phi4": _headers("<|im_start|>", "<|im_sep|>", "<|im_end|>", "<|im_start|>assistant<|im_sep|>"),
    "falcon3": _headers("<|", "|>\n", "\n", "<|assistant|>\n"),
    "zephyr": _headers("<|", "|>\n", "<|endoftext|>\n", "<|assistant|>\n"),
    "monarch": _monarch,
    "gemma": _gemma,
    "orion": _orion,
    "openchat": _openchat,
    "vicuna": _vicuna(orca=False),
    "vicuna-orca": _vicuna(orca=True),
    "deepseek": _by_role(
        {
            "system": ("", ""),
            "user": ("### Instruction:\n", "\n"),
            "assistant": ("### Response:\n", "\n<|EOT|>\n"),
        },
        "### Response:\n",
    ),
    "deepseek2": _by_role(
        {"system": ("", "\n\n"), "user": ("User: ", "\n\n"), "assistant": ("Assistant: ", _EOS_DS)},
        "Assistant:",
    ),
    "deepseek3": _by_role(
        {
            "system": ("", "\n\n"),
            "user": ("<｜User｜>", ""),
            "assistant": ("<｜Assistant｜>", _EOS_DS),
        },
        "<｜Assistant｜>",
    ),
    "command-r": _by_role(
        {
            "system": (f"{_COHERE}<|SYSTEM_TOKEN|>", "<|END_OF_TURN_TOKEN|>"),
            "user": (f"{_COHERE}<|USER_TOKEN|>", "<|END_OF_TURN_TOKEN|>"),
            "assistant": (f"{_COHERE}<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"),
        },
        f"{_COHERE}<|CHATBOT_TOKEN|>",
        trim=True,
    ),
    "chatglm4": lambda chat, add_ass: (
        "[gMASK]<sop>" + _headers("<|", "|>\n", "", "<|assistant|>\n")(chat, add_ass)
    ),
    "glmedge": _headers("<|", "|>\n", "", "<|assistant|>"),
    "chatglm3": lambda chat, add_ass: (
        "[gMASK]sop" + _headers("<|", "|>\n ", "", "<|assistant|>")(chat, add_ass)
    ),
    "minicpm": _minicpm,
}


def _llama3(chat: Msgs, add_ass: bool) -> str:
    out = "".join(
        f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{_trim(m['content'])}<|eot_id|>"
        for m in chat
    )
    return out + ("<|start_header_id|>assistant<|end_header_id|>\n\n" if add_ass else "")


BUILTIN["llama3"] = _llama3

# llama.cpp's other built-in names (src/llama-chat.cpp), not ported: refused by name.
UNPORTED = frozenset(
    """exaone3 exaone4 exaone-moe rwkv-world granite granite-4.0 granite-4.1 gigachat megrez
    yandex bailing bailing-think bailing2 llama4 smolvlm hunyuan-moe gpt-oss hunyuan-dense
    hunyuan-vl kimi-k2 seed_oss grok-2 pangu-embedded solar-open deepseek-ocr""".split()
)


def render_builtin(name: str, messages: Msgs, add_generation_prompt: bool) -> str:
    """The prompt of built-in template `name` (a key of `BUILTIN`) for checked messages."""
    return BUILTIN[name](messages, add_generation_prompt)
