"""The values a capability probe hands a chat template (`caps.detect_caps`), each recording
how the template used it, as llama.cpp's common/jinja/caps.cpp values do: *used* when the
template looks it up, tests it, calls a method or filter on it or loops over it (`tojson`
and `string` use every value inside), with the operations that ran on it
(`test_is_string`, `selectattr`, `array_access`...)."""

from __future__ import annotations

import copy
from typing import Any

import jinja2

from loraserve.chat.jinja_env import LlamaEnvironment


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


def track(v: Any) -> Any:
    """`v` (JSON data) with every string, list and object recording its use."""
    if _stat(v) is not None:
        return v
    if isinstance(v, str):
        out: Any = _TStr(v)
    elif isinstance(v, list):
        out = _TList(track(x) for x in v)
    elif isinstance(v, dict):
        out = _TDict((k, track(x)) for k, x in v.items())
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


TRACKING = _TrackingEnvironment()


def run_probe(
    template: jinja2.Template, messages: list, tools: list | None, extra: dict[str, Any]
) -> tuple[bool, Any, Any, str, dict[str, Any]]:
    """Render one probe with tracked values: (whether the template accepted it, the tracked
    messages, tools and extra variables, the output)."""
    msgs, tls = track(copy.deepcopy(messages)), track(copy.deepcopy(tools or []))
    extra = {k: track(v) for k, v in extra.items()}
    variables = {"messages": msgs, "tools": tls, "bos_token": "", "eos_token": ""}
    variables.update(add_generation_prompt=True, **extra)
    try:
        out = template.render(**variables)
        return True, msgs, tls, out, extra
    except Exception:  # noqa: BLE001 - a refused probe is a capability answer
        return False, msgs, tls, "", extra


def is_used(v: Any) -> bool:
    """Whether the template used the tracked value `v`."""
    stat = _stat(v)
    return bool(stat and stat.used)


def ops_on(v: Any) -> set[str]:
    """The operations the template ran on the tracked value `v`."""
    stat = _stat(v)
    return stat.ops if stat else set()
