"""A tagged call's arguments as llguidance Lark rules (`<parameter=KEY>\nVALUE\n</parameter>`
and the like), after llama.cpp's grammars for them:

- the autoparser's tagged tools (`chat-auto-parser-generator.cpp`): the required arguments
  in the schema's order, `space` between, then the optional ones in any order;
- Qwen3-Coder/Qwen3.5/StepFun (`parsers/qwen3-coder.cpp`): the required ones in any order
  (its `permute`, up to six), then the optional ones in any order;
- MiniCPM5 (`parsers/minicpm5.cpp`): every argument in any order;
- llama.cpp lets an optional argument come back any number of times (and MiniCPM5's
  required ones be left out): ours takes each key once, the required ones always, as a
  JSON object holds them (a random model otherwise repeats one key until its token limit);
- a value whose schema may be a string is raw text up to the value's end marker (a union
  with other types too: llama.cpp's grammar keeps only the string rule), MiniCPM5's may be
  wrapped in `<![CDATA[..]]>` (then it may hold the end marker); any other value is JSON
  held to its schema.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from loraserve.chat.formats.description import ChatFormat
from loraserve.chat.formats.values import may_be_string

NO_CDATA = r"NOCDATA: /(.|\n)*/ & ~/<!\[CDATA\[(.|\n)*/"
MAX_PERMUTE = 6  # llama.cpp's COMMON_CHAT_MAX_PERMUTE: more required arguments keep their order
MAX_ANY_ORDER = 8  # at most 2**8 rules for one tool's arguments


class TaggedArgs:
    """The argument rules of a `_Builder` (its `fmt`, `q`, `rule` and `json_value`)."""

    fmt: ChatFormat
    q: Callable[[str], str]
    rule: Callable[..., str]
    rules: list[str]
    json_value: Callable[[Any], str]

    def tagged_args(self, params: dict[str, Any]) -> str:
        """The arguments of a call whose parameters are `params`, as grammar items."""
        props = params.get("properties") or {}
        required = [k for k in props if k in (params.get("required") or [])]
        args = {key: self._arg(key, props[key]) for key in props}
        req = [args[k] for k in required]
        opt = [args[k] for k in props if k not in required]
        detector = self.fmt.detector
        ws = "" if detector == "qwen3_coder" else "WS "  # the autoparser's `space` between
        if detector == "minicpm5" and len(req) + len(opt) <= MAX_ANY_ORDER:
            some = self._some(req, opt, ws) if req or opt else ""
            return some if req or not some else f"({some})?"
        if detector == "qwen3_coder" and 1 < len(req) <= MAX_PERMUTE:
            head = self._some(req, [], ws)
        else:
            head = " ".join(f"{ws if i else ''}{a}" for i, a in enumerate(req))
        if not opt:
            return head
        lead = ws if head else ""
        if len(opt) > MAX_ANY_ORDER:  # each in order
            tail = " ".join(f"({lead if not i else ws}{a})?" for i, a in enumerate(opt))
        else:
            tail = f"({lead}{self._some([], opt, ws)})?"
        return f"{head} {tail}".strip()

    def _some(self, req: list[str], opt: list[str], ws: str) -> str:
        """A rule taking each of `req` once and each of `opt` at most once (one at least), in
        any order, `ws` between: llama.cpp's `permute` of the required arguments (its
        optional ones may also repeat, but a key twice makes no JSON object); one rule per
        set of arguments left."""
        every = req + opt
        needed = (1 << len(req)) - 1
        memo: dict[int, str] = {}

        def some(left: int) -> str:
            if left not in memo:
                alts = []
                for i, arg in enumerate(every):
                    rest = left & ~(1 << i)
                    if not left & (1 << i):
                        continue
                    if not rest:
                        alts.append(arg)
                    elif rest & needed:
                        alts.append(f"{arg} {ws}{some(rest)}")
                    else:
                        alts.append(f"{arg} ({ws}{some(rest)})?")
                memo[left] = self.rule(" | ".join(alts))
            return memo[left]

        return some((1 << len(every)) - 1)

    def _arg(self, key: str, schema: Any) -> str:
        f = self.fmt
        pieces = (self.q(f.arg_name_prefix), json.dumps(key), self.q(f.arg_name_suffix),
                  self.q(f.arg_value_prefix))  # fmt: skip
        head = " ".join(x for x in pieces if x)
        if may_be_string(schema):
            value = self._text_value(schema if isinstance(schema, dict) else {})
        else:
            value = f"{self.json_value(schema)} {self.q(f.arg_value_suffix)}"
        return self.rule(f"{head} {value} {self.q(f.arg_separator)}".strip())

    def _text_value(self, schema: dict[str, Any]) -> str:
        """A tagged string value and its end marker (bounded as its schema says)."""
        end = self.q(self.fmt.arg_value_suffix)
        bounded = _bounded(schema)
        if not self.fmt.cdata_values:
            return self.rule(f"TEXT {end}", lazy=True) if bounded is None else f"{bounded} {end}"
        # MiniCPM5: `<![CDATA[..]]>` may hold the end marker; a value that does not open
        # one is text as llama.cpp's `negate(CDATA) until(</param>)` (one lexeme each)
        if NO_CDATA not in self.rules:
            self.rules.append(NO_CDATA)
        inner = self.rule('TEXT "]]>"', lazy=True)
        plain = self.rule(f"NOCDATA {end}", lazy=True) if bounded is None else f"{bounded} {end}"
        return f'("<![CDATA[" {inner} {end} | {plain})'


def _bounded(schema: dict[str, Any]) -> str | None:
    """A tagged string value's own rule when the schema bounds it (enum, const, maxLength),
    else None (free text up to the value's end marker)."""
    options = schema.get("enum") or (["const"] if "const" in schema else None)
    if options:
        values = [schema["const"]] if "const" in schema else options
        return "(" + " | ".join(json.dumps(str(v)) for v in values) + ")"
    top = schema.get("maxLength")
    if isinstance(top, int):
        low = schema.get("minLength", 0)
        return f"/(.|\\n){{{low if isinstance(low, int) else 0},{top}}}/"
    return None
