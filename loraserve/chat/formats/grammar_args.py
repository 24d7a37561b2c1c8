"""A tagged call's arguments as llguidance Lark rules (`<parameter=KEY>\nVALUE\n</parameter>`
and the like), after llama.cpp's grammars for them:

- the autoparser's tagged tools (`chat-auto-parser-generator.cpp`): the required arguments
  in the schema's order, `space` between, then the optional ones in any order;
- Qwen3-Coder/Qwen3.5/StepFun (`parsers/qwen3-coder.cpp`): the required ones in any order
  (its `permute`, up to six), then the optional ones in any order;
- MiniCPM5 (`parsers/minicpm5.cpp`): every argument in any order;
- the optional arguments in any order, a key repeating, as llama.cpp's grammars let them
  (`repeat(space + any_optional, 0, -1)`; `zero_or_more` in Qwen3-Coder and MiniCPM5; the
  parser keeps each occurrence, JSON readers the last), up to `optional_runs` of them in a
  row (each once and four more: a random model repeating one key otherwise never ends the
  call); ours keeps the required ones exactly once where MiniCPM5's lets them be left out
  or repeat (each tool's `required` holds);
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
from loraserve.chat.formats.special.lark import optional_runs
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
        any_opt = self.rule(" | ".join(opt)) if opt else ""
        detector = self.fmt.detector
        ws = "" if detector == "qwen3_coder" else "WS "  # the autoparser's `space` between
        if detector == "minicpm5":  # each argument then `space`, in any order
            return self._any_order(req, any_opt, ws, optional_runs(len(opt)))
        if detector == "qwen3_coder" and 1 < len(req) <= MAX_PERMUTE:
            head = self._permute(req, ws)
        else:
            head = " ".join(f"{ws if i else ''}{a}" for i, a in enumerate(req))
        return f"{head} ({ws}{any_opt}){{0,{optional_runs(len(opt))}}}".strip() if opt else head

    def _permute(self, req: list[str], ws: str) -> str:
        """Each of `req` exactly once, in any order, `ws` between (llama.cpp's `permute`);
        one rule per set of arguments left."""
        memo: dict[int, str] = {}

        def left(mask: int) -> str:
            if mask not in memo:
                alts = []
                for i, arg in enumerate(req):
                    rest = mask & ~(1 << i)
                    if mask & (1 << i):
                        alts.append(f"{arg} {ws}{left(rest)}" if rest else arg)
                memo[mask] = self.rule(" | ".join(alts))
            return memo[mask]

        return left((1 << len(req)) - 1)

    def _any_order(self, req: list[str], any_opt: str, ws: str, most: int) -> str:
        """MiniCPM5: the arguments in any order, each followed by `ws`, the optional ones
        repeating (up to `most` in a row), the required ones once each (in the schema's
        order past MAX_ANY_ORDER of them)."""
        tail = f"({any_opt} {ws}){{0,{most}}}" if any_opt else ""
        if not req:
            return tail
        if len(req) > MAX_ANY_ORDER:
            return " ".join(f"{tail} {a} {ws}" for a in req) + f" {tail}"
        memo: dict[int, str] = {}

        def left(mask: int) -> str:  # optional ones, then one of the required ones left
            if not mask:
                return tail
            if mask not in memo:
                alts = [f"{a} {ws}{left(mask & ~(1 << i))}" for i, a in enumerate(req)
                        if mask & (1 << i)]  # fmt: skip
                memo[mask] = self.rule(f"{tail} ({' | '.join(alts)})")
            return memo[mask]

        return left((1 << len(req)) - 1)

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
