"""Value types and actions of the command line's flags (`args.py`): bounded numbers, comma
lists, JSON objects, chat templates (checked at parse time), and llama-server's `--lora` /
`--lora-scaled` forms in command-line order."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LoraSpec:
    """An adapter given on the command line; its id is its position in `ServerConfig.lora`."""

    path: str
    scale: float = 1.0


def int_in(lo: int, hi: int | None = None, note: str = "") -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            bounds = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise argparse.ArgumentTypeError(f"must be {bounds}{note}, got {value}")
        return value

    return parse


def float_in(lo: float | None = None, hi: float | None = None) -> Any:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be in [{lo}, {hi}], got {value}")
        return value

    return parse


def csv(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


class LoraAction(argparse.Action):
    """`--lora A,B` and `--lora-scaled A:0.5,B:1` (or the older `--lora-scaled A 0.5`), in
    command-line order into one list: an adapter's id is its position, as in llama-server."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None):
        specs = list(getattr(namespace, self.dest) or [])
        try:
            if option_string == "--lora":
                specs += [LoraSpec(path) for path in csv(values)]
            elif len(values) == 2:
                specs.append(LoraSpec(values[0], float_in()(values[1])))
            elif len(values) == 1:
                for item in csv(values[0]):
                    path, sep, scale = item.rpartition(":")
                    if not sep or not path:
                        raise argparse.ArgumentTypeError(
                            f"expected PATH:SCALE (or PATH SCALE), got {item!r}"
                        )
                    specs.append(LoraSpec(path, float_in()(scale)))
            else:
                raise argparse.ArgumentTypeError(
                    f"expected PATH:SCALE[,PATH:SCALE...] or PATH SCALE, got {' '.join(values)!r}"
                )
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentError(self, str(exc)) from None
        setattr(namespace, self.dest, specs)


class CsvAppend(argparse.Action):
    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None):
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest) or []), *csv(values)])


class ApiKeyAppend(CsvAppend):
    """`--api-key KEY[,KEY]`: an empty or blank key is refused (it would leave the server
    open without a word)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None):
        if not all(item.strip() for item in str(values).split(",")):
            parser.error(
                f"argument {option_string}: empty API key {values!r} "
                "(it would leave the server open; give a key, or no --api-key)"
            )
        super().__call__(parser, namespace, values, option_string)


def json_object(text: str) -> dict[str, Any]:
    """A JSON object (`--chat-template-kwargs`)."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def lora_module(text: str) -> tuple[str, str, str | None]:
    """One `--lora-modules` value (vLLM's): `name=path` or its JSON form; the path must
    exist."""
    from loraserve.lora.catalogue import parse_module

    try:
        name, path, base = parse_module(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not os.path.exists(path):
        raise argparse.ArgumentTypeError(f"{name}: no such adapter file or folder: {path!r}")
    return name, os.path.realpath(path), base


def chat_template_flag(text: str) -> str:
    """`--chat-template`: a built-in template's name, or Jinja text that compiles."""
    from loraserve.chat.template import check_template_flag

    try:
        check_template_flag(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def chat_template_file(path: str) -> str:
    """`--chat-template-file`: the text of a Jinja template file that compiles."""
    from loraserve.chat.template import compile_template

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise argparse.ArgumentTypeError(f"cannot read {path!r}: {e}") from None
    try:
        compile_template(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def read_api_key_file(parser: argparse.ArgumentParser, path: str) -> list[str]:
    """The keys of an `--api-key-file` (one per line; blank lines and `#` comments skipped);
    an unreadable file, or one holding no key, is a command-line error naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        parser.error(f"argument --api-key-file: cannot read {path!r}: {why}")
    keys = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    if not keys:
        parser.error(
            f"argument --api-key-file: {path!r} holds no key (empty, blank or comment lines "
            "only; it would leave the server open)"
        )
    return keys
