"""What a chat template can show, found as llama.cpp finds it (common/jinja/caps.cpp): the
template runs on probe conversations whose values record how the template used them, and
each capability is read from those records.

A value is *used* when the template looks it up (a variable, an attribute or item of
another value), tests it (`is string`), calls a method or filter on it, or loops over it;
`tojson` and `string` use every value inside. A value also records which operations ran on
it (`test_is_string`, `selectattr`, `array_access` for an integer index or a loop...).
The probes and the reading of them are llama.cpp's, in its order; a probe the template
refuses (raises) counts as llama.cpp counts it. `TemplateCaps.to_map()` is what
llama-server reports as `/props` `chat_template_caps`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any

import jinja2

from loraserve.chat.jinja_env import LlamaEnvironment


@dataclass(frozen=True)
class TemplateCaps:
    """llama.cpp's `jinja::caps` (defaults as there)."""

    supports_tools: bool = True
    supports_tool_calls: bool = True
    supports_system_role: bool = True
    supports_parallel_tool_calls: bool = True
    supports_preserve_reasoning: bool = False
    supports_reasoning_effort: bool = False
    supports_string_content: bool = True
    supports_typed_content: bool = False
    supports_object_arguments: bool = False

    def to_map(self) -> dict[str, bool]:
        """The capabilities by name, keys sorted (llama.cpp's `std::map`)."""
        return {f.name: getattr(self, f.name) for f in sorted(fields(self), key=lambda f: f.name)}


class _Stat:
    __slots__ = ("ops", "used")

    def __init__(self) -> None:
        self.used = False
        self.ops: set[str] = set()


class _TStr(str):
    __slots__ = ("stat",)

    def __iter__(self):  # noqa: ANN204 - llama.cpp refuses a loop over a string
        stat = _stat(self)
        if stat is not None:
            stat.used = True
            stat.ops.add("array_access")
        raise TypeError("Expected iterable or object type in for loop: got String")


class _TList(list):
    __slots__ = ("stat",)

    def __iter__(self):  # noqa: ANN204
        self.stat.used = True
        self.stat.ops.add("array_access")
        return super().__iter__()


class _TDict(dict):
    __slots__ = ("stat",)


def _stat(v: Any) -> _Stat | None:
    return getattr(v, "stat", None) if isinstance(v, _TStr | _TList | _TDict) else None


def _track(v: Any) -> Any:
    """`v` (JSON data) with every string, list and object recording its use."""
    if _stat(v) is not None:
        return v
    if isinstance(v, str):
        out: Any = _TStr(v)
    elif isinstance(v, list):
        out = _TList(_track(x) for x in v)
    elif isinstance(v, dict):
        out = _TDict((k, _track(x)) for k, x in v.items())
    else:
        return v
    out.stat = _Stat()
    return out


def _mark(v: Any, deep: bool = False, op: str | None = None) -> None:
    stat = _stat(v)
    if stat is not None:
        stat.used = True
        if op:
            stat.ops.add(op)
    if deep and isinstance(v, dict):
        for x in dict.values(v):
            _mark(x, True)
    elif deep and isinstance(v, list):
        for x in list.__iter__(v):
            _mark(x, True)


class _TrackingContext(jinja2.runtime.Context):
    def resolve_or_missing(self, key: str) -> Any:
        v = super().resolve_or_missing(key)
        _mark(v)
        return v


class _TrackingEnvironment(LlamaEnvironment):
    context_class = _TrackingContext

    def __init__(self) -> None:
        super().__init__()
        for name, fn in list(self.filters.items()):
            self.filters[name] = self._filter(name, fn)
        for name, fn in list(self.tests.items()):
            self.tests[name] = self._test(name, fn)

    @staticmethod
    def _filter(name: str, fn: Any) -> Any:
        deep = name in ("tojson", "string")

        def run(*args: Any, **kwargs: Any) -> Any:
            i = 1 if getattr(fn, "jinja_pass_arg", None) is not None else 0
            if len(args) > i:
                _mark(args[i], deep, name)
            return fn(*args, **kwargs)

        if getattr(fn, "jinja_pass_arg", None) is not None:
            run.jinja_pass_arg = fn.jinja_pass_arg  # type: ignore[attr-defined]
        return run

    @staticmethod
    def _test(name: str, fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            i = 1 if getattr(fn, "jinja_pass_arg", None) is not None else 0
            if len(args) > i:
                _mark(args[i], False, "test_is_" + name)
            return fn(*args, **kwargs)

        if getattr(fn, "jinja_pass_arg", None) is not None:
            run.jinja_pass_arg = fn.jinja_pass_arg  # type: ignore[attr-defined]
        return run

    def _access(self, obj: Any, key: Any, value: Any) -> Any:
        if not isinstance(value, jinja2.Undefined):
            _mark(value)
            op = "array_access" if isinstance(key, int) and not isinstance(obj, dict) else None
            _mark(obj, op=op or "object_access")
        return value

    def getitem(self, obj: Any, argument: Any) -> Any:
        return self._access(obj, argument, super().getitem(obj, argument))

    def getattr(self, obj: Any, attribute: str) -> Any:
        value = self._access(obj, attribute, super().getattr(obj, attribute))
        if isinstance(obj, _TDict) and attribute == "get":
            # the value `get` answers is used as llama.cpp's shared values are: by name later
            def get(*args: Any) -> Any:
                found = value(*args)
                _mark(found)
                return found

            return get
        return value


_TRACKING = _TrackingEnvironment()


def _run(
    template: jinja2.Template, messages: list, tools: list | None, extra: dict[str, Any]
) -> tuple[bool, Any, Any, str, dict[str, Any]]:
    msgs, tls = _track(copy.deepcopy(messages)), _track(copy.deepcopy(tools or []))
    extra = {k: _track(v) for k, v in extra.items()}
    variables = {"messages": msgs, "tools": tls, "bos_token": "", "eos_token": ""}
    variables.update(add_generation_prompt=True, **extra)
    try:
        out = template.render(**variables)
        return True, msgs, tls, out, extra
    except Exception:  # noqa: BLE001 - a refused probe is a capability answer
        return False, msgs, tls, "", extra


def _used(v: Any) -> bool:
    stat = _stat(v)
    return bool(stat and stat.used)


def _ops(v: Any) -> set[str]:
    stat = _stat(v)
    return stat.ops if stat else set()


_TOOL = {
    "name": "tool",
    "type": "function",
    "function": {
        "name": "tool1",
        "description": "Tool description",
        "parameters": {
            "type": "object",
            "properties": {"arg": {"type": "string", "description": "Arg description"}},
            "required": ["arg"],
        },
    },
}


def _call(n: int, args: Any) -> dict[str, Any]:
    return {
        "id": f"call0000{n}",
        "type": "function",
        "function": {"name": "tool1", "arguments": args},
    }


def _tool_chat(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
        {"role": "assistant", "content": "The tool response was 'tool response'"},
        {"role": "user", "content": "User message"},
    ]


def _preserve(enabled: bool) -> dict[str, bool]:
    return {
        "preserve_thinking": enabled,
        "clear_thinking": not enabled,
        "truncate_history_thinking": not enabled,
        "drop_thinking": not enabled,
    }


@lru_cache(maxsize=32)
def detect_caps(source: str) -> TemplateCaps:
    """The capabilities of the Jinja template `source` (llama.cpp's `caps_get`)."""
    try:
        t = _TRACKING.from_string(source)
    except jinja2.TemplateError:
        return TemplateCaps()
    r: dict[str, bool] = {}
    marker = "STRING_MARKER"
    ok, msgs, _, out, _ = _run(t, [{"role": "user", "content": marker}], None, {})
    content = msgs[0]["content"]
    checks_for_string = "test_is_string" in _ops(content)
    as_array = bool(_ops(content) & {"selectattr", "array_access"})
    if as_array:
        r["supports_typed_content"] = True
    if not ok or (as_array and marker not in out):
        r["supports_string_content"] = False
    if checks_for_string:
        ok, msgs, _, _, _ = _run(t, [{"role": "user", "content": []}], None, {})
        if ok and _ops(msgs[0]["content"]) & {"selectattr", "array_access"}:
            r["supports_typed_content"] = True

    system = [
        {"role": "system", "content": "System message"},
        {"role": "user", "content": "User message"},
    ]
    _, msgs, _, _, _ = _run(t, system, None, {})
    if not _used(msgs[0]["content"]):
        r["supports_system_role"] = False

    ok, msgs, tools, _, _ = _run(t, _tool_chat([_call(1, {"arg": "value"})]), [_TOOL], {})
    object_args = False
    if ok:
        if not _used(tools[0]["function"]["name"]):
            r["supports_tools"] = False
        calls = msgs[1]["tool_calls"]
        if not _used(calls):
            r["supports_tool_calls"] = False
        elif _used(calls[0]["function"]["arguments"]["arg"]):
            object_args = r["supports_object_arguments"] = True
    if not object_args:
        ok, msgs, tools, _, _ = _run(t, _tool_chat([_call(1, '{"arg": "value"}')]), [_TOOL], {})
        if not ok:
            r["supports_tool_calls"] = r["supports_tools"] = False
        else:
            if not _used(tools[0]["function"]["name"]):
                r["supports_tools"] = False
            if not _used(msgs[1]["tool_calls"]):
                r["supports_tool_calls"] = False

    args: Any = {"arg": "value"} if object_args else '{"arg": "value"}'
    ok, msgs, _, _, _ = _run(t, _tool_chat([_call(1, args), _call(2, args)]), [_TOOL], {})
    if not ok or not _used(msgs[1]["tool_calls"][1]["function"]):
        r["supports_parallel_tool_calls"] = False

    placeholder = "<REASONING_CONTENT_PLACEHOLDER>"
    history = [
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "Assistant message", "reasoning_content": placeholder},
        {"role": "user", "content": "User message"},
        {
            "role": "assistant",
            "content": "Assistant message",
            "reasoning_content": "Reasoning content",
        },
        {"role": "user", "content": "User message"},
    ]
    _, _, _, out, _ = _run(t, history, None, {"enable_thinking": True, **_preserve(True)})
    if placeholder in out:
        r["supports_preserve_reasoning"] = True

    low = _track("low")  # one value under both names, as llama.cpp binds them
    effort = {"enable_thinking": True, "reasoning_effort": low, "reasoning_strength": low}
    _, _, _, _, extra = _run(t, [{"role": "user", "content": "User message"}], None, effort)
    r["supports_reasoning_effort"] = _used(extra["reasoning_effort"])
    return TemplateCaps(**r)
