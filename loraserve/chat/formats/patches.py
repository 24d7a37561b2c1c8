"""llama.cpp's per-template patches to the differential analysis (the `workarounds` of
common/chat-diff-analyzer.cpp), each keyed on text of the template source: what renders
with sentinels cannot show (old Qwen/DeepSeek templates that drop reasoning, Granite 3.3's
`<response>`, Command R+, Functionary 3.1, DeepSeek R1 Distill Qwen, Nemotron Nano v2,
Fireworks, Solar Open, Apriel 1.6, the `{"name", "parameters"}` instruction, Laguna, Bailing).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loraserve.chat.formats.analyze import ID1, Analysis
from loraserve.chat.formats.diff import trim

Patch = Callable[[str, Analysis, dict[str, Any]], None]


def _tokens(extra: dict[str, Any], *tokens: str, clear: bool = False) -> None:
    if clear:
        extra["preserved_tokens"] = []
    extra["preserved_tokens"].extend(tokens)


def _old_qwen(src: str, an: Analysis, extra: dict[str, Any]) -> None:
    if (
        "content.split('</think>')" in src
        and "reasoning_content" not in src
        and "<SPECIAL_12>" not in src
        and an.get("reasoning_mode") == "none"
    ):
        an.f.update(reasoning_mode="tag", reasoning_start="<think>", reasoning_end="</think>")
        _tokens(extra, "<think>", "</think>")


def _granite(src: str, an: Analysis, extra: dict[str, Any]) -> None:
    if (
        "Write your thoughts between <think></think> and write your response between "
        "<response></response>" in src
    ):
        an.f.update(reasoning_mode="tag", reasoning_start="<think>", reasoning_end="</think>")
        an.f.update(content_start="<response>", content_end="</response>")
        _tokens(extra, "<think>", "</think>", "<response>", "</response>")


def _command_r_plus(src: str, an: Analysis, extra: dict[str, Any]) -> None:
    if (
        "<|CHATBOT_TOKEN|>" in src
        and "<|END_OF_TURN_TOKEN|>" in src
        and not an.get("content_start")
    ):
        an.f.update(content_start="<|CHATBOT_TOKEN|>", content_end="<|END_OF_TURN_TOKEN|>")
        an.f["user_start"] = "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>"
        _tokens(extra, "<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>")


def _functionary_31(src: str, an: Analysis, extra: dict[str, Any]) -> None:
    if (
        'set has_code_interpreter = tools | selectattr("type", "equalto", '
        '"code_interpreter") | list | length > 0' in src
    ):
        an.f.update(
            content_start="", content_end="", name_prefix="", section_start="",
            section_end="", call_start="<function=", call_end="</function>", call_close="",
        )  # fmt: skip
        _tokens(extra, "<|eot_id|>", "<|eom_id|>", "<function=", ">", "</function>", clear=True)


def _r1_distill_qwen(src: str, an: Analysis, extra: dict[str, Any]) -> None:
    if (
        "{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + "
        "'<｜tool▁sep｜>'" in src
    ):
        an.f.update(
            section_start="<｜tool▁calls▁begin｜>", section_end="<｜tool▁calls▁end｜>",
            call_start="<｜tool▁call▁begin｜>function", name_prefix="<｜tool▁sep｜>",
            call_end="<｜tool▁call▁end｜>", call_close="```",
        )  # fmt: skip


def _nemotron_v2(src: str, an: Analysis, extra: dict[str, Any]) -> None:
    if all(t in src for t in ("<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<TOOL_RESPONSE>")):
        an.f.update(
            tool_mode="json", section_start="", section_end="", call_start="<TOOLCALL>",
            call_end="</TOOLCALL>", array_wrapped=True, content_start="", content_end="",
            reasoning_mode="tag", reasoning_start="<think>\n", reasoning_end="</think>",
            assistant_start="<SPECIAL_11>Assistant", user_start="<SPECIAL_11>User",
        )  # fmt: skip
        _tokens(extra, "<SPECIAL_11>", "</think>", "<TOOLCALL>", "</TOOLCALL>", clear=True)


def _fireworks(src: str, an: Analysis, extra: dict[str, Any]) -> None:
    if (
        "{%- set system_prompt = '<|start_header_id|>' + 'system' + '<|end_header_id|>\\n\\n' "
        "+ message['content'] | trim + '\\n' + system_prompt_suffix + '<|eot_id|>' -%}" in src
    ):
        an.f["assistant_start"] = "<|start_header_id|>assistant<|end_header_id|>"
        an.f["user_start"] = "<|start_header_id|>user<|end_header_id|>"


def _solar_open(src: str, an: Analysis, extra: dict[str, Any]) -> None:
    if "<|begin|>assistant<|think|><|end|>" in src:
        an.f["assistant_start"] = "<|begin|>assistant"
    # ours: the call id before the name is the call's own (`<|tool_call:begin|>ID
    # <|tool_call:name|>NAME`); the analysis (llama.cpp's too) bakes its sentinel id into
    # the name marker, so a call with any other id would not be one
    head = an.get("name_prefix")
    if head.startswith(ID1) and head[len(ID1) :].strip() and an.get("id_position") == "none":
        an.f.update(id_position="pre_name", id_prefix="", id_suffix=head[len(ID1) :],
                    name_prefix="")  # fmt: skip


def _apriel_16(src: str, an: Analysis, extra: dict[str, Any]) -> None:
    if "if not loop.last and '[BEGIN FINAL RESPONSE]' in asst_text" in src:
        an.f.update(user_start="<|begin_user|>", assistant_start="<|begin_assistant|>")


def _name_parameters(src: str, an: Analysis, extra: dict[str, Any]) -> None:
    if 'Respond in the format {"name": function name' in src and "Do not use variables." in src:
        an.f["openai_wrapper_trigger"] = True


def _laguna(src: str, an: Analysis, extra: dict[str, Any]) -> None:
    if "laguna_glm_thinking" in src:
        for key in ("reasoning_start", "reasoning_end", "arg_value_prefix", "arg_value_suffix",
                    "arg_separator"):  # fmt: skip
            an.f[key] = trim(an.get(key))
        an.f["tolerate_intertag_whitespace"] = True
        extra["additional_stops"].append("</assistant>")


def _bailing_v3(src: str, an: Analysis, extra: dict[str, Any]) -> None:
    if "Bailing V3 chat template" in src:
        an.f["arg_value_suffix"] = trim(an.get("arg_value_suffix"))
        an.f["tolerate_intertag_whitespace"] = True


PATCHES: tuple[Patch, ...] = (
    _old_qwen, _granite, _command_r_plus, _functionary_31, _r1_distill_qwen, _nemotron_v2,
    _fireworks, _solar_open, _apriel_16, _name_parameters, _laguna, _bailing_v3,
)  # fmt: skip
