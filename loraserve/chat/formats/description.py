"""The format of one chat template's assistant turns: where reasoning, content and tool calls
sit in the text a model writes, and how each call spells its name, arguments and id.

One `ChatFormat` drives both the output parser (`parse.py`) and the grammar that constrains
generation (`grammar.py`), as llama.cpp's `autoparser` structures (common/chat-auto-parser.h)
drive its PEG parser and its GBNF. The fields keep llama.cpp's names so a description can be
compared with what llama-server derives for the same template (`fields()`).

Tool-call modes (llama.cpp's `tool_format`):
- ``json``: each call is a JSON object (`{"name": .., "arguments": {..}}`, Hermes/Qwen inside
  `<tool_call>`, Llama 3.x bare with `parameters`, Mistral Nemo a `[TOOL_CALLS]` array);
- ``tag_json``: the name in markers, the arguments one JSON object
  (`[TOOL_CALLS]name[ARGS]{..}`, DeepSeek's `<｜tool▁sep｜>name\n```json\n{..}````);
- ``tag_tagged``: the name and each argument in markers (Qwen3-Coder's
  `<function=name>\n<parameter=key>\nvalue\n</parameter>`), values converted to JSON by the
  tool's schema.
``dialect`` names a specialised parser (`special/`) for formats the fields cannot describe
(gpt-oss harmony channels, Gemma 4's value notation, DeepSeek's DSML, LFM2's Python calls,
MiniMax-M3's schema-expanded XML, Ling 3, Kimi K3, Cohere2 MoE, Muse, Functionary v3.2); its
fields then still name the markers (reasoning tags, trigger, preserved tokens) llama-server
reports; empty for every format the fields describe.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

ToolMode = Literal["none", "json", "tag_json", "tag_tagged"]
ReasoningMode = Literal["none", "tag", "tools_only"]
IdPosition = Literal["none", "pre_name", "between_name_and_args", "post_args"]


@dataclass(frozen=True)
class ChatFormat:
    """Markers and encodings of one template's assistant turns (empty string: absent)."""

    detector: str = "auto"  # "auto" (differential analysis) or the specialised detector's name
    dialect: str = ""  # a specialised parser's name; "" when the fields below describe it all
    # reasoning
    reasoning_mode: ReasoningMode = "none"
    reasoning_start: str = ""
    reasoning_end: str = ""
    # content wrapped in markers (Command R+: <|CHATBOT_TOKEN|>..<|END_OF_TURN_TOKEN|>)
    content_start: str = ""
    content_end: str = ""
    # tool calls
    tool_mode: ToolMode = "none"
    section_start: str = ""
    section_end: str = ""
    call_start: str = ""
    call_end: str = ""
    # json mode: the fields of one call object (dotted for nested: "function.name")
    name_field: str = "name"
    args_field: str = "arguments"
    id_field: str = ""
    gen_id_field: str = ""
    function_field: str = "function"
    fun_name_is_key: bool = False
    array_wrapped: bool = False
    parameter_order: tuple[str, ...] = ()
    openai_wrapper_trigger: bool = False
    # tag modes: the function's markers
    name_prefix: str = ""
    name_suffix: str = ""
    args_separator: str = ""
    call_close: str = ""
    # the arguments block, and tag_tagged's per-argument markers
    args_start: str = ""
    args_end: str = ""
    arg_name_prefix: str = ""
    arg_name_suffix: str = ""
    arg_value_prefix: str = ""
    arg_value_suffix: str = ""
    arg_separator: str = ""
    tolerate_intertag_whitespace: bool = False
    cdata_values: bool = False  # MiniCPM5: a string value may be wrapped in <![CDATA[..]]>
    # call ids written by the model
    id_position: IdPosition = "none"
    id_prefix: str = ""
    id_suffix: str = ""
    name_id_index: bool = False  # Kimi K2: the name is written `functions.NAME:N`, the id
    call_start_optional: bool = False  # Qwen3-Coder: a first call may skip `call_start`
    optional_markers: tuple[str, ...] = ()  # Kimi K2: a section marker the model may omit
    reasoning_stops: tuple[str, ...] = ()  # markers that also end reasoning (a call's start)
    # turn markers and what the tokenizer must keep whole
    assistant_start: str = ""
    user_start: str = ""
    preserved_tokens: tuple[str, ...] = ()
    additional_stops: tuple[str, ...] = ()
    supports_parallel: bool = True
    thinking_end_tags: tuple[str, ...] = field(default=())
    # the lazy grammar's regex triggers where a word cannot start the calls (gpt-oss's
    # ` to=functions` after a channel, Functionary's `>>>NAME`); `trigger` is then ""
    trigger_patterns: tuple[str, ...] = ()

    @property
    def has_tools(self) -> bool:
        """Whether calls can be parsed (and constrained) in this format."""
        return self.tool_mode != "none" or self.dialect != ""

    @property
    def has_reasoning(self) -> bool:
        """Whether the template knows reasoning markers (llama-server's supports_thinking)."""
        return self.reasoning_mode != "none" or self.dialect == "harmony"

    @property
    def trigger(self) -> str:
        """The marker that starts the tool calls (the lazy grammar's trigger), or ""."""
        return (self.section_start or self.call_start) if self.has_tools else ""

    def with_(self, **changes: Any) -> ChatFormat:
        """A copy with some fields changed."""
        return replace(self, **changes)

    def fields(self) -> dict[str, Any]:
        """The description as plain data (tuples as lists), for logs and oracle comparisons."""
        out = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


PLAIN = ChatFormat(detector="plain")
"""Plain content: no reasoning markers, no tool calls (an unknown template's answer)."""
