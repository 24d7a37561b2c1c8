"""The Jinja environment chat templates run in, with the semantics of llama.cpp's own engine
(common/jinja/: runtime.cpp, value.cpp) where they differ from jinja2's.

jinja2's sandbox (`SandboxedEnvironment`: lists and dicts may change, as in llama.cpp's
engine, on a copy of the inputs made for each render; `trim_blocks` and `lstrip_blocks` on, as
llama.cpp's lexer) parses and runs the template; what llama.cpp's engine does differently is
put back:

- an undefined value is lenient (`LenientUndefined`): it prints as "", an attribute or item
  of it is undefined again, a loop over it runs zero times, and `+` or `~` with a string
  treats it as "" (as a `none` is treated); any other operation on it fails;
- printing (`{{ x }}`): none and undefined print nothing, a list prints its items one after
  the other, an object prints nothing, a float prints as C++'s `std::to_string` without its
  trailing zeros; `~` joins values the same way, and `+` with a string concatenates;
- `tojson` writes JSON as the engine does (`", "` and `": "` separators, keys in insertion
  order, non-ASCII kept unless `ensure_ascii`), undefined as `null`;
- a value's built-in method (`spec.items` of a dict, as jinja2 and llama.cpp both find
  it before the key) has no attributes or items: using one is an error ("Function has no
  builtins"), where jinja2 answers undefined (Command R+'s tool template then fails on any
  tool with an array parameter, in both);
- globals `raise_exception`, `strftime_now` (local time) and the `loopcontrols` extension.
"""

from __future__ import annotations

import json
import types
from collections.abc import Iterable
from datetime import datetime
from functools import lru_cache
from typing import Any, NoReturn

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.sandbox import SandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template does not compile, or refused the messages (its `raise_exception`)."""


class LenientUndefined(jinja2.ChainableUndefined):
    """llama.cpp's undefined: "" when printed or joined to a string, undefined again for
    any attribute or item of it, an empty loop."""

    __slots__ = ()

    def __str__(self) -> str:
        return ""

    def __add__(self, other: Any) -> Any:
        if isinstance(other, str):
            return other
        return self._fail_with_undefined_error()

    def __radd__(self, other: Any) -> Any:
        if isinstance(other, str):
            return other
        return self._fail_with_undefined_error()


def format_float(v: float) -> str:
    """A float as llama.cpp prints it: `std::to_string` (6 decimals) without trailing zeros,
    keeping one ("1.0")."""
    out = f"{v:.6f}".rstrip("0")
    return out + "0" if out.endswith(".") else out


def _elems(v: list | tuple) -> list[Any]:
    """The items of a list without iterating it (a tracked list in `caps` records loops)."""
    return [v[i] for i in range(len(v))]


def repr_value(v: Any) -> str:
    """A value inside a printed list or object (llama.cpp's `value_to_string_repr`: Python's
    repr, strings with a quote written as JSON)."""
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False) if "'" in v else f"'{v}'"
    if isinstance(v, list):
        return "[" + ", ".join(repr_value(x) for x in _elems(v)) + "]"
    if isinstance(v, tuple):
        return "(" + ", ".join(repr_value(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{repr_value(k)}: {repr_value(x)}" for k, x in v.items()) + "}"
    if v is None:
        return "None"
    return as_text(v)


def as_text(v: Any) -> str:
    """A value as `~` and `+` join it to a string (llama.cpp's `as_string`; none and
    undefined as "")."""
    if v is None or isinstance(v, jinja2.Undefined):
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, float):
        return format_float(v)
    if isinstance(v, list | tuple | dict):
        return repr_value(v)
    return str(v)


def to_string(v: Any) -> str:
    """The `string` and `safe` filters (llama.cpp's: numbers as JSON, none as "None",
    undefined as "", no HTML markup)."""
    if v is None:
        return "None"
    if isinstance(v, int | float) and not isinstance(v, bool):
        return json.dumps(v)
    return as_text(v)


def _items(v: Any) -> list[tuple[Any, Any]]:
    if v is None or isinstance(v, jinja2.Undefined):
        return []
    if not isinstance(v, dict):
        raise TypeError(f"items() needs an object, got {type(v).__name__}")
    return list(v.items())


def finalize(v: Any) -> str:
    """What `{{ v }}` prints (llama.cpp's `gather_string_parts`)."""
    if isinstance(v, str):
        return v
    if v is None or isinstance(v, jinja2.Undefined | dict):
        return ""
    if isinstance(v, list | tuple):
        return "".join(finalize(x) for x in _elems(v))
    return as_text(v)


def concat(values: Iterable[Any]) -> str:
    """`a ~ b ~ ...`."""
    return "".join(as_text(v) for v in values)


def _raise_exception(message: str) -> NoReturn:
    raise ChatTemplateError(f"chat template error: {message}")


NOW_VAR = "__loraserve_now__"
"""A template variable holding the `datetime` `strftime_now` formats (else the local time)."""


@jinja2.pass_context
def _strftime_now(context: jinja2.runtime.Context, fmt: str) -> str:
    now = context.get(NOW_VAR)
    return (now if isinstance(now, datetime) else datetime.now()).strftime(fmt)


def _plain(value: Any) -> Any:
    if isinstance(value, jinja2.Undefined):
        return None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in _elems(value)]
    return value


def tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | list[str] | None = None,
    sort_keys: bool = False,
) -> str:
    """llama.cpp's `tojson` (value.cpp): Python's `json.dumps` defaults but non-ASCII kept."""
    if sort_keys:
        raise ChatTemplateError("chat template error: tojson sort_keys=true not implemented")
    seps = tuple(separators) if separators else None
    if seps is not None and len(seps) == 1:
        seps = (seps[0], ": ")
    return json.dumps(
        _plain(value),
        ensure_ascii=bool(ensure_ascii),
        indent=indent if isinstance(indent, int) and not isinstance(indent, bool) else None,
        separators=seps,  # type: ignore[arg-type]
    )


class GenerationExtension(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask markers): the
    body, as llama.cpp runs it."""

    tags = {"generation"}  # noqa: RUF012 - jinja2's class attribute

    def parse(self, parser: Any) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _as_list(fn: Any) -> Any:
    """A jinja2 filter that answers a generator, answering a list as llama.cpp's does (so
    `length`, `tojson` and indexing work on it)."""

    def run(*args: Any, **kwargs: Any) -> list[Any]:
        return list(fn(*args, **kwargs))

    if getattr(fn, "jinja_pass_arg", None) is not None:
        run.jinja_pass_arg = fn.jinja_pass_arg  # type: ignore[attr-defined]
    return run


class _LlamaCodeGenerator(CodeGenerator):
    """`~` through the environment's `concat` (none and undefined as "")."""

    def _output_child_to_const(self, node: nodes.Expr, frame: Frame, finalize: Any) -> str:
        """Constants are folded with Python's `str`, so a `~` is left to run time."""
        if isinstance(node, nodes.Concat) or any(node.find_all(nodes.Concat)):
            raise nodes.Impossible()
        return super()._output_child_to_const(node, frame, finalize)

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:  # noqa: N802 - jinja2's
        self.write("environment.concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class LlamaEnvironment(SandboxedEnvironment):
    """jinja2's sandbox with llama.cpp's engine's semantics (see the module docstring)."""

    code_generator_class = _LlamaCodeGenerator
    intercepted_binops = frozenset({"+"})

    def __init__(self) -> None:
        super().__init__(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=["jinja2.ext.loopcontrols", GenerationExtension],
            undefined=LenientUndefined,
            finalize=finalize,
        )
        self.filters["tojson"] = tojson
        self.filters["string"] = self.filters["safe"] = to_string
        self.filters["items"] = _items
        for name in ("map", "select", "reject", "selectattr", "rejectattr"):
            self.filters[name] = _as_list(self.filters[name])
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = _strftime_now
        self.concat = concat

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        """An unsafe attribute (`__class__`...) is an error, not a lenient undefined."""
        raise jinja2.exceptions.SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
        )

    def getattr(self, obj: Any, attribute: str) -> Any:
        """`obj.attribute`; on a built-in method an error, as in llama.cpp's engine."""
        if isinstance(obj, types.BuiltinMethodType):
            raise ChatTemplateError(f"chat template error: Function has no builtins ({attribute})")
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        """`obj[argument]`; on a built-in method an error, as in llama.cpp's engine."""
        if isinstance(obj, types.BuiltinMethodType):
            raise ChatTemplateError(f"chat template error: Function has no builtins ({argument})")
        return super().getitem(obj, argument)

    def call_binop(
        self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any
    ) -> Any:
        """`+`: a string with anything concatenates (none and undefined as "")."""
        if operator == "+" and (isinstance(left, str) or isinstance(right, str)):
            return as_text(left) + as_text(right)
        return super().call_binop(context, operator, left, right)


_ENV = LlamaEnvironment()


@lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    """Compile (once per source text) a chat template; `ChatTemplateError` if it is invalid."""
    try:
        return _ENV.from_string(source)
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"chat template does not compile: {exc}") from None


def render_source(template: jinja2.Template, variables: dict[str, Any]) -> str:
    """Run a compiled template; `ChatTemplateError` naming what failed."""
    try:
        return template.render(**variables)
    except ChatTemplateError:
        raise
    except (jinja2.TemplateError, TypeError, ValueError, LookupError, AttributeError) as exc:
        raise ChatTemplateError(f"chat template error: {type(exc).__name__}: {exc}") from None
