"""The prompt side of llama.cpp's specialised chat formats (common/parsers/*.cpp): for the
templates `common_chat_try_specialized_template` picks by markers in their source, what
changes in the messages before rendering, what follows the prompt when an assistant message
is continued, and whether the format supports thinking.

`find(source)` checks the markers in llama.cpp's order and answers the `Special` (None for
the templates the differential analyser handles). `patch_source` applies the two source
patches of `common_chat_templates_init` (gpt-oss's and Mistral's refusals turned off).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loraserve.chat.messages import Msg, render_content

Continue = Callable[[str, str, Msg, bool], str]
"""(prompt, generation prompt, continued message, content too) -> what follows the prompt."""


@dataclass(frozen=True)
class Special:
    """One specialised format's prompt rules."""

    name: str
    supports_thinking: bool
    cont: Continue
    adjust: Callable[[list[Msg]], list[Msg]] | None = None


def _rc(m: Msg) -> str:
    return m.get("reasoning_content", "")


def _fixed(gen: str | None, think: str, end: str, after_end: str = "") -> Continue:
    """The common shape: GEN (None: the template's generation prompt) + THINK + reasoning,
    then for content END + AFTER + content."""

    def cont(prompt: str, gp: str, m: Msg, content: bool) -> str:
        out = (gen if gen is not None else gp) + think + _rc(m)
        return out + end + after_end + render_content(m) if content else out

    return cont


def _thinking_field(drop_content_with_calls: bool) -> Callable[[list[Msg]], list[Msg]]:
    def adjust(msgs: list[Msg]) -> list[Msg]:
        out = []
        for m in msgs:
            if isinstance(m.get("reasoning_content"), str):
                m = {**m, "thinking": m["reasoning_content"]}
                if drop_content_with_calls and m.get("tool_calls"):
                    m.pop("content", None)
            out.append(m)
        return out

    return adjust


def _ministral_adjust(msgs: list[Msg]) -> list[Msg]:
    out = []
    for m in msgs:
        if m["role"] not in ("system", "assistant"):
            out.append(m)
            continue
        blocks: list[Any] = []
        if isinstance(m.get("reasoning_content"), str):
            blocks.append({"type": "thinking", "thinking": m["reasoning_content"]})
        if isinstance(m.get("content"), str):
            blocks.append({"type": "text", "text": m["content"]})
        elif isinstance(m.get("content"), list):
            blocks.extend(m["content"])
        m = {**m, "content": blocks}
        m.pop("reasoning_content", None)
        out.append(m)
    return out


def _deepseek_v4_sort(msgs: list[Msg]) -> list[Msg]:
    """Tool results in the order of the calls they answer."""
    out, order, i = list(msgs), {}, 0
    while i < len(out):
        m = out[i]
        if m["role"] == "assistant" and m.get("tool_calls"):
            order = {tc["id"]: k for k, tc in enumerate(m["tool_calls"]) if tc.get("id")}
            i += 1
            continue
        if m["role"] not in ("user", "tool"):
            i += 1
            continue
        end = i
        while end < len(out) and out[end]["role"] in ("user", "tool"):
            end += 1
        pos = [k for k in range(i, end) if out[k]["role"] == "tool"]
        if len(pos) > 1 and order:
            results = sorted(
                (out[k] for k in pos), key=lambda r: order.get(r.get("tool_call_id", ""), 0)
            )
            for k, r in zip(pos, results, strict=True):
                out[k] = r
        i = end
    return out


def _gemma4_responses(msgs: list[Msg]) -> list[Msg]:
    """An assistant's calls, the tool results after them and a final answer, as one
    assistant message with `tool_responses` (older Gemma 4 templates)."""
    out, i = [], 0
    while i < len(msgs):
        m = msgs[i]
        if m["role"] != "assistant" or not m.get("tool_calls"):
            out.append(m)
            i += 1
            continue
        calls, responses, content = list(m["tool_calls"]), [], None
        reasoning = m.get("reasoning_content")
        i += 1
        while i < len(msgs) and msgs[i]["role"] == "tool":
            r = msgs[i]
            response = r.get("content")
            if isinstance(response, str):
                try:
                    response = json.loads(response)
                except json.JSONDecodeError:
                    pass
            n = len(responses)
            name = calls[n]["function"].get("name", "") if n < len(calls) else ""
            responses.append({"name": name or r.get("tool_call_id", ""), "response": response})
            i += 1
        if i < len(msgs) and msgs[i]["role"] == "assistant" and not msgs[i].get("tool_calls"):
            if msgs[i].get("content"):
                content = msgs[i]["content"]
                i += 1
        turn: Msg = {"role": "assistant", "tool_calls": calls}
        if responses:
            turn["tool_responses"] = responses
        if content is not None:
            turn["content"] = content
        if reasoning is not None:
            turn["reasoning_content"] = reasoning
        out.append(turn)
    return out


def _gemma4_cont(prompt: str, gp: str, m: Msg, content: bool) -> str:
    out = (
        ("<|turn>model\n" if prompt.endswith("<turn|>\n") else "") + "<|channel>thought\n" + _rc(m)
    )
    return out + "<channel|>" + render_content(m) if content else out


def _deepseek_cont(v4: bool) -> Continue:
    def cont(prompt: str, gp: str, m: Msg, content: bool) -> str:
        if v4 and not _rc(m):
            return "<｜Assistant｜></think>" + (render_content(m) if content else "")
        out = "<｜Assistant｜><think>" + _rc(m)
        return out + "</think>" + render_content(m) if content else out

    return cont


def _qwen3_coder_cont(thinks: bool) -> Continue:
    def cont(prompt: str, gp: str, m: Msg, content: bool) -> str:
        out = "<|im_start|>assistant\n"
        if thinks:
            out += "<think>\n" + _rc(m) + ("\n</think>\n\n" if content else "")
        return out + render_content(m) if content else out

    return cont


def _plain_cont(gen: str) -> Continue:
    return lambda prompt, gp, m, content: gen + render_content(m)


def _has(src: str, *marks: str) -> bool:
    return all(mark in src for mark in marks)


def find(src: str) -> Special | None:
    """The specialised format llama.cpp picks for the template `src`, or None."""
    if _has(src, "[SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]") and "[CALL_ID]" not in src:
        return Special("ministral_3", True, _fixed("", "[THINK]", "[/THINK]"), _ministral_adjust)
    if "<|channel|>" in src:
        cont = _fixed("<|start|>assistant<|channel|>analysis<|message|>", "", "<|end|>",
                      "<|start|>assistant<|channel|>final<|message|>")  # fmt: skip
        return Special("gpt_oss", True, cont, _thinking_field(True))
    if _has(src, "<atem:function_calls>", "<|eom|>"):
        cont = _fixed("<|start|>assistant to=self<|message|>", "", "<|eom|>",
                      "<|start|>assistant to=user<|message|>")  # fmt: skip
        return Special("muse_glimmer", True, cont)
    if _has(src, ">>>all", ">>>${recipient}"):
        gen = "<|start_header_id|>assistant<|end_header_id|>\n\n>>>all\n"
        return Special("functionary_v3_2", False, _plain_cont(gen))
    if _has(src, "<|tool_calls_section_begin|>", "<|tool_call_begin|>"):
        return Special(
            "kimi_k2", True, _fixed("<|im_assistant|>assistant<|im_middle|>", "<think>", "</think>")
        )
    if _has(src, "<|open|>", "<|close|>", "<|end_of_msg|>"):
        cont = _fixed('<|open|>message role="assistant"<|sep|>', "<|open|>think<|sep|>",
                      "<|close|>think<|sep|>", "<|open|>response<|sep|>")  # fmt: skip
        return Special("kimi_k3", True, cont)
    if _has(src, "<role>ASSISTANT</role>", "<arg_key>"):
        return Special("ling_3", True, _fixed("<role>ASSISTANT</role>\n", "<think>", "</think>"))
    if _has(src, "<|START_TEXT|>", "<|START_ACTION|>"):
        cont = _fixed("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", "<|START_THINKING|>",
                      "<|END_THINKING|>", "<|START_TEXT|>")  # fmt: skip
        return Special("cohere2_moe", True, cont)
    lfm2 = _has(src, "<|tool_list_start|>", "<|tool_list_end|>")
    if lfm2 or ("List of tools: [" in src and "<|tool_list_start|>" not in src):
        cont = _fixed("<|im_start|>assistant\n", "<think>", "</think>")
        return Special("lfm2" if lfm2 else "lfm2_5", True, cont, _thinking_field(False))
    if _has(src, "<|role_sep|>", "<|message_sep|>") and "<|function_call|>" not in src:
        return Special("gigachat_3", False, _plain_cont("assistant<|role_sep|>\n"))
    if _has(src, "]<]minimax[>[", "<tool_call>", "<invoke name="):
        return Special("minimax_m3", True, _fixed(None, "<mm:think>", "</mm:think>"))
    if "dsml_token" in src and "DSML" in src and ("function_calls" in src or "tool_calls" in src):
        v4 = "function_calls" not in src
        return Special("deepseek_v3_2", True, _deepseek_cont(v4), _deepseek_v4_sort if v4 else None)
    if "'<|tool_call>call:'" in src:
        old = "{#- OpenAI Chat Completions:" not in src
        return Special("gemma_4", True, _gemma4_cont, _gemma4_responses if old else None)
    if _has(src, "Tool usage guidelines:", '<function name="', '<param name="'):
        return Special(
            "minicpm_5", True, _fixed("<|im_start|>assistant\n", "<think>\n", "\n</think>\n\n")
        )
    if _has(src, "<tool_call>", "<function=", "<parameter=") and (
        "'<tool_call><function=' ~ tool_call.name ~ '>'" not in src
    ):
        thinks = "<think>" in src
        return Special("qwen3_coder", thinks, _qwen3_coder_cont(thinks))
    return None


def patch_source(src: str) -> str:
    """`common_chat_templates_init`'s patches: gpt-oss's and Mistral's template refusals off."""
    if "<|channel|>" in src and "in message.content or" in src:
        src = src.replace(
            '{%- if "<|channel|>analysis<|message|>" in message.content or '
            '"<|channel|>final<|message|>" in message.content %}',
            "{%- if false %}",
        )
    if "[TOOL_CALLS]" in src and "if (message['content'] is none or" in src:
        src = src.replace(
            "{%- if (message['content'] is none or message['content'] == '' or "
            "message['content']|length == 0) and (message['tool_calls'] is not defined or "
            "message['tool_calls'] is none or message['tool_calls']|length == 0) %}",
            "{%- if false %}",
        )
    return src
