"""Helpers of the chat-format tests: the peer's templates, a plain jinja2 renderer for the
differential analysis, the assistant turn a template writes for a message, and a byte-level
vocabulary for llguidance so a grammar can be checked against text."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jinja2
import llguidance
from jinja2.sandbox import ImmutableSandboxedEnvironment

DATA = Path(__file__).resolve().parents[2] / "data" / "chat"
TEMPLATES = DATA / "templates"
END_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "</s>", "<｜end▁of▁sentence｜>",
               "<|endoftext|>", "<|user|>", "<|observation|>", "[/TOOL_CALLS]", "<|im_assistant|>",
               "]~b]", "<|im_user|>", "<|end|>", "[e~[", "<|message_sep|>", "<|tool_response>",
               "<turn|>", "<|END_OF_TURN_TOKEN|>", "<|close|>message<|sep|>",
               "<|eot|>", "<seed:eos>", "<｜hy_eos:opensource｜>", "<end_of_sentence>",
               "<SPECIAL_12>", "<sep>", "<|end_of_text|>", "</assistant>",
               "<|START_OF_TURN_TOKEN|>", "<|begin|>")  # fmt: skip


def _raise(msg: str) -> None:
    raise jinja2.TemplateError(msg)


@functools.cache
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = lambda v, indent=None, **k: json.dumps(
        v, ensure_ascii=False, indent=indent
    )
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: "14 Mar 2025"
    return env.from_string(source)


def render_for(source: str):  # noqa: ANN201 - formats.analyze.Render
    """A renderer of `source` for the differential analysis."""

    def render(msgs: list, tools: list | None, gen: bool, think: bool) -> str:
        kw: dict[str, Any] = dict(
            messages=msgs, add_generation_prompt=gen, enable_thinking=think,
            bos_token="", eos_token="",
        )  # fmt: skip
        if tools is not None:
            kw["tools"] = tools
        return _compile(source).render(**kw)

    return render


def assistant_text(
    source: str, message: dict[str, Any], tools: list[dict[str, Any]], render: Any = None
) -> str:
    """What the template writes for `message` after the generation prompt (up to the turn's
    end marker): the text a model trained on it would generate. `render`: a renderer as
    `render_for` returns (default: plain jinja2)."""
    render = render or render_for(source)
    user = [{"role": "user", "content": "Hi"}]
    prompt = render(user, tools, True, True)
    full = render([*user, message], tools, False, True)
    if not full.startswith(prompt):  # the generation prompt opened something the turn closes
        common = 0
        while common < min(len(full), len(prompt)) and full[common] == prompt[common]:
            common += 1
        while common and prompt[common - 1] not in "\n>":
            common -= 1
        prompt = prompt[:common]
    text = full[len(prompt) :]
    if text.rstrip().endswith("</s>"):  # only there: a call's `<s>` argument closes so too
        text = text.rstrip()[:-4]
    cut = [text.find(m, 1) for m in END_MARKERS if m != "</s>" and text.find(m, 1) > 0]
    return text[: min(cut)] if cut else text


class _ByteVocab:
    """256 byte tokens, an end token, and the given markers as special tokens."""

    def __init__(self, specials: tuple[str, ...]) -> None:
        self.specials = specials
        self.tokens = [bytes([i]) for i in range(256)] + [b"\xff<eos>"]
        self.tokens += [b"\xff" + s.encode() for s in specials]
        self.eos_token_id, self.bos_token_id = 256, None
        self.special_token_ids = list(range(256, len(self.tokens)))

    def __call__(self, s: str | bytes) -> list[int]:
        return list(s if isinstance(s, bytes) else s.encode())


def grammar_accepts(lark: str, text: str, specials: tuple[str, ...] = ()) -> str | None:
    """None when llguidance's matcher for `lark` accepts `text` whole (markers in `specials`
    as single special tokens), else why not."""
    vocab = _ByteVocab(specials)
    tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(vocab))
    grammar = llguidance.grammar_from("lark", lark)
    error = llguidance.LLMatcher.validate_grammar(grammar, tok)
    if error and not error.startswith("WARNING"):
        return f"invalid grammar: {error}"
    m = llguidance.LLMatcher(tok, grammar, log_level=0)
    ids, i = [], 0
    while i < len(text):
        for k, s in enumerate(specials):
            if text.startswith(s, i):
                ids.append(257 + k)
                i += len(s)
                break
        else:
            ids.extend(text[i].encode())
            i += 1
    for n, t in enumerate(ids):
        if not m.consume_token(t):
            return f"rejected at token {n}: {m.get_error()[:200]}"
    return None if m.is_accepting() else "not accepting at the end"
