"""A chat rendered into a prompt as llama-server renders it with `--jinja`
(`common_chat_templates_apply_jinja`, common/chat.cpp, and the prompt half of the format's
parameters: `common_chat_template_direct_apply`).

The steps, in llama.cpp's order: the messages and tools rebuilt as llama.cpp shows them
(`messages.parse_messages`, `parse_tools`); the template's `tool_use` variant when there are
tools; for a continued last assistant message (prefill) the others rendered without the
generation prompt, then the generation prompt and that message's text (its parts joined by
"\\n\\n"; with reasoning markers, the reasoning first); the fix-ups for the template's
capabilities (`messages.fix_messages`); the variables: `messages`, `bos_token`,
`eos_token`, `enable_thinking` (always), `tools` (when there are), `datetime`
("%b %d %Y") and `date_string` ("%d %b %Y"), the template kwargs over those, and
`add_generation_prompt` (only when true); a `preserve_reasoning` kwarg sets
`preserve_thinking` and its opposites, a `reasoning_effort` one also `reasoning_strength`.
A leading BOS / trailing EOS the tokenizer adds itself is cut from the result.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from loraserve.chat import special
from loraserve.chat.caps import detect_caps
from loraserve.chat.jinja_env import NOW_VAR, compile_template, render_source
from loraserve.chat.messages import Msg, fix_messages, parse_messages, parse_tools, render_content

Continuation = Literal["none", "auto", "content", "reasoning"]
STEPFUN_MARK = "You have access to the following functions in JSONSchema format"


@dataclass(frozen=True)
class Tokens:
    """The model's special tokens as a template sees them, and whether the tokenizer adds
    BOS / EOS itself (then a template's own is cut)."""

    bos: str = ""
    eos: str = ""
    add_bos: bool = False
    add_eos: bool = False


@dataclass
class RenderInputs:
    """One render's inputs (llama.cpp's `common_chat_templates_inputs`, the prompt's part).

    `kwargs` are the template kwargs as JSON values (`--chat-template-kwargs` updated by the
    request's); `reasoning_markers` the format's (start, end) reasoning markers, used to
    continue an assistant message; `now` the time `datetime` and `date_string` show."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    continuation: Continuation = "none"
    enable_thinking: bool = True
    kwargs: dict[str, Any] = field(default_factory=dict)
    reasoning_markers: tuple[str, str] = ("", "")
    now: datetime | None = None


def _variables(
    msgs: list[Msg], tools: list | None, tokens: Tokens, inp: RenderInputs, add_gen: bool
) -> dict[str, Any]:
    now = inp.now or datetime.now()
    v: dict[str, Any] = {
        "messages": copy.deepcopy(msgs),  # a template may change them (`append`...)
        "bos_token": tokens.bos,
        "eos_token": tokens.eos,
        "enable_thinking": inp.enable_thinking,
    }
    if tools:
        v["tools"] = copy.deepcopy(tools)
    v["datetime"] = now.strftime("%b %d %Y")
    v["date_string"] = now.strftime("%d %b %Y")
    v.update(inp.kwargs)
    if add_gen:
        v["add_generation_prompt"] = True
    if inp.now is not None:
        v[NOW_VAR] = inp.now
    keep = v.get("preserve_reasoning")
    if isinstance(keep, bool):
        v.update(preserve_thinking=keep, clear_thinking=not keep)
        v.update(truncate_history_thinking=not keep, drop_thinking=not keep)
    effort = v.get("reasoning_effort")
    if isinstance(effort, str) and effort:
        v["reasoning_strength"] = effort
    return v


def direct_apply(
    source: str, tokens: Tokens, msgs: list[Msg], tools: list | None, inp: RenderInputs,
    add_gen: bool,
) -> str:  # fmt: skip
    """One run of the template over already fixed messages (`common_chat_template_direct_apply`)."""
    out = render_source(compile_template(source), _variables(msgs, tools, tokens, inp, add_gen))
    if tokens.add_bos and tokens.bos and out.startswith(tokens.bos):
        out = out[len(tokens.bos) :]
    if tokens.add_eos and tokens.eos and out.endswith(tokens.eos):
        out = out[: -len(tokens.eos)]
    return out


def generation_prompt(
    source: str, tokens: Tokens, msgs: list[Msg], tools: list | None, inp: RenderInputs
) -> str:
    """What `add_generation_prompt` adds: the render with it past the common prefix of the
    renders without and with it."""
    without = direct_apply(source, tokens, msgs, tools, inp, False)
    with_ = direct_apply(source, tokens, msgs, tools, inp, True)
    n = 0
    while n < min(len(without), len(with_)) and without[n] == with_[n]:
        n += 1
    return with_[n:]


def _trim_all(msgs: list[Msg]) -> list[Msg]:
    out = []
    for m in msgs:
        m = dict(m)
        if isinstance(m.get("content"), str):
            m["content"] = m["content"].strip()
        elif isinstance(m.get("content"), list):
            m["content"] = [
                {**p, "text": p["text"].strip()} if p["type"] == "text" else p for p in m["content"]
            ]
        if "reasoning_content" in m:
            m["reasoning_content"] = m["reasoning_content"].strip()
            if not m["reasoning_content"]:
                del m["reasoning_content"]
        out.append(m)
    return out


def select_source(default: str, tool_use: str | None, tools: Any) -> str:
    """The template llama.cpp renders with: the `tool_use` variant when tools are given."""
    return tool_use if tool_use and isinstance(tools, list) and tools else default


def render(source: str, tokens: Tokens, inp: RenderInputs) -> str:
    """The prompt for `inp` with the Jinja template `source` (see the module docstring).
    ValueError naming the problem (malformed messages or tools, the template refusing)."""
    source = special.patch_source(source)
    msgs = parse_messages(inp.messages)
    tools = parse_tools(inp.tools)
    if STEPFUN_MARK in source:
        msgs = _trim_all(msgs)
    caps = detect_caps(source)
    add_gen = inp.add_generation_prompt
    mode = inp.continuation
    cont: Msg | None = None
    if mode != "none" and msgs:
        add_gen, cont, msgs = False, msgs[-1], msgs[:-1]
        if mode == "auto":
            only_reasoning = cont.get("reasoning_content") and not cont.get("content")
            mode = "reasoning" if only_reasoning else "content"
    fixed = fix_messages(msgs, caps, source)
    spec = special.find(source)
    if spec is not None and spec.adjust is not None:
        fixed = spec.adjust(fixed)
    prompt = direct_apply(source, tokens, fixed, tools, inp, add_gen)
    if spec is not None and spec.name == "gpt_oss" and not add_gen:
        at = prompt.rfind("<|return|>")  # llama.cpp's inference fix (its issue 15417)
        prompt = prompt if at < 0 else prompt[:at] + "<|end|>" + prompt[at + len("<|return|>") :]
    if spec is not None and spec.name == "gemma_4" and add_gen and prompt.endswith("<turn|>\n"):
        prompt += "<|turn>model\n"
    if cont is None:
        return prompt
    gen = generation_prompt(source, tokens, fixed, tools, inp)
    if spec is not None:
        return prompt + spec.cont(prompt, gen, cont, mode == "content")
    start, end = inp.reasoning_markers
    if start:
        at = gen.find(start)
        gen = (gen if at < 0 else gen[:at]) + start + cont.get("reasoning_content", "")
        if mode == "content":
            gen += end
    if mode == "content":
        gen += render_content(cont)
    return prompt + gen


def supports_thinking_by_render(source: str, tokens: Tokens) -> bool:
    """Whether `enable_thinking` changes the template's generation prompt (used when the
    format's own answer is not available)."""
    base = RenderInputs([{"role": "user", "content": "test"}])
    off = RenderInputs(base.messages, enable_thinking=False)
    try:
        return render(source, tokens, base) != render(source, tokens, off)
    except ValueError:
        return False
