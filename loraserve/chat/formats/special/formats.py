"""The descriptions of the templates llama-server gives a specialised format (common/chat.cpp
`common_chat_try_specialized_template` and common/parsers/*.cpp), each chosen by markers in
the template source, in llama.cpp's order (`SPECIALISED`). Where the `ChatFormat` fields
spell the calls (Ministral 3, Kimi K2, Qwen3-Coder/Qwen3.5/Nemotron 3, MiniCPM5, GigaChat 3)
the generic parser and grammar serve them; the others name a `dialect`, parsed by this
package's module of that name (their grammar is not built yet: unconstrained)."""

from __future__ import annotations

from collections.abc import Callable

from loraserve.chat.formats.description import ChatFormat
from loraserve.chat.formats.special import cohere2, dsml, kimi_k3, minimax_m3, muse

_MINISTRAL = ChatFormat(
    detector="ministral_3", reasoning_mode="tag", reasoning_start="[THINK]",
    reasoning_end="[/THINK]", tool_mode="tag_json", call_start="[TOOL_CALLS]",
    name_suffix="[ARGS]", preserved_tokens=("[THINK]", "[/THINK]", "[TOOL_CALLS]", "[ARGS]"),
    assistant_start="[/INST]",
)  # fmt: skip
_KIMI_K2 = ChatFormat(
    detector="kimi_k2", reasoning_mode="tag", reasoning_start="<think>", reasoning_end="</think>",
    tool_mode="tag_json", call_start="<|tool_call_begin|>", call_end="<|tool_call_end|>",
    optional_markers=("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),
    name_prefix="functions.", name_suffix="<|tool_call_argument_begin|>", name_id_index=True,
    reasoning_stops=("<|tool_calls_section_begin|>", "<|tool_call_begin|>"),
    assistant_start="<|im_assistant|>assistant<|im_middle|>",
    preserved_tokens=("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                      "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
                      "<think>", "</think>"),
)  # fmt: skip
_QWEN3_CODER = ChatFormat(
    detector="qwen3_coder", tool_mode="tag_tagged", call_start="<tool_call>\n",
    call_end="</tool_call>", name_prefix="<function=", name_suffix=">\n",
    call_close="</function>", arg_name_prefix="<parameter=", arg_name_suffix=">\n",
    arg_value_suffix="\n</parameter>\n", preserved_tokens=("<tool_call>", "</tool_call>"),
    assistant_start="<|im_start|>assistant", call_start_optional=True,
)  # fmt: skip
_MINIMAX_M3 = ChatFormat(
    detector="minimax_m3", dialect="minimax_m3", reasoning_mode="tag",
    reasoning_start=minimax_m3.THINK, reasoning_end=minimax_m3.THINK_END,
    section_start=minimax_m3.START, section_end=minimax_m3.END, name_prefix=minimax_m3.INVOKE,
    call_close=minimax_m3.INVOKE_END, assistant_start="]~b]ai", user_start="]~b]user",
    preserved_tokens=(minimax_m3.NS, "<tool_call>", "</tool_call>", minimax_m3.THINK,
                      minimax_m3.THINK_END),
)  # fmt: skip
_MINICPM5 = ChatFormat(
    detector="minicpm5", reasoning_mode="tag", reasoning_start="<think>",
    reasoning_end="</think>", tool_mode="tag_tagged", name_prefix=' name="',
    name_suffix='">', call_close="</function>", call_start="<function",
    arg_name_prefix='<param name="', arg_name_suffix='">', arg_value_suffix="</param>",
    tolerate_intertag_whitespace=True, cdata_values=True, assistant_start="<|im_start|>assistant",
    preserved_tokens=("<function", "<param", "</function>", "</param>", "<think>", "</think>"),
)  # fmt: skip
_HARMONY = ChatFormat(
    detector="gpt_oss", dialect="harmony", reasoning_mode="tag",
    reasoning_start="<|channel|>analysis<|message|>", reasoning_end="<|end|>",
    assistant_start="<|start|>assistant",
    preserved_tokens=("<|channel|>", "<|constrain|>", "<|message|>", "<|start|>", "<|end|>"),
    trigger_patterns=(
        r"^\s+to$", r"^<\|channel\|>(?:commentary|analysis)\s+to=functions$",
        r"<\|start\|>assistant(\s+to)",
        r"<\|start\|>assistant(<\|channel\|>(?:commentary|analysis)\s+to)",
    ),
)  # fmt: skip
_GEMMA_4 = ChatFormat(
    detector="gemma_4", dialect="gemma_4", reasoning_mode="tag",
    reasoning_start="<|channel>thought", reasoning_end="<channel|>", call_start="<|tool_call>",
    call_end="<tool_call|>", name_prefix="call:", assistant_start="<|turn>model",
    user_start="<|turn>user",
    preserved_tokens=("<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|turn>"),
)  # fmt: skip


def _deepseek_v3_2(src: str) -> ChatFormat:
    v4 = "function_calls" not in src  # V4 names the block tool_calls
    start, end = dsml.block(v4)
    return ChatFormat(
        detector="deepseek_v3_2", dialect="deepseek_v4" if v4 else "deepseek_v3_2",
        reasoning_mode="tag", reasoning_start="<think>", reasoning_end="</think>",
        thinking_end_tags=("</think>", start), section_start=start, section_end=end,
        name_prefix=dsml.INVOKE, call_close=dsml.INVOKE_END, arg_name_prefix=dsml.PARAM,
        arg_value_suffix=dsml.PARAM_END, assistant_start="<｜Assistant｜>",
        user_start="<｜User｜>", preserved_tokens=(dsml.DSML, "<think>", "</think>"),
    )  # fmt: skip


def _lfm2(src: str, tool_list: bool) -> ChatFormat:
    tokens = ("<|tool_call_start|>", "<|tool_call_end|>", "<think>", "</think>")
    if tool_list:
        tokens += ("<|tool_list_start|>", "<|tool_list_end|>")
    return ChatFormat(
        detector="lfm2" if tool_list else "lfm2_5",
        dialect="lfm2" if "<think>" in src else "lfm2_plain", reasoning_mode="tag",
        reasoning_start="<think>", reasoning_end="</think>", call_start="<|tool_call_start|>",
        call_end="<|tool_call_end|>", assistant_start="<|im_start|>assistant",
        user_start="<|im_start|>user",
        preserved_tokens=tokens,
    )  # fmt: skip


_LING_3 = ChatFormat(
    detector="ling_3", dialect="ling_3", reasoning_mode="tag", reasoning_start="<think>",
    reasoning_end="</think>", thinking_end_tags=("</think>", "<tool_call>"),
    call_start="<tool_call>", call_end="</tool_call>", arg_name_prefix="<arg_key>",
    arg_name_suffix="</arg_key>", arg_value_prefix="<arg_value>",
    arg_value_suffix="</arg_value>", assistant_start="<role>ASSISTANT</role>",
    user_start="<role>HUMAN</role>", additional_stops=("<|role_end|>",),
    preserved_tokens=("<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>",
                      "</arg_key>", "<arg_value>", "</arg_value>", "<|role_end|>"),
)  # fmt: skip
_KIMI_K3 = ChatFormat(
    detector="kimi_k3", dialect="kimi_k3", reasoning_mode="tag", reasoning_start=kimi_k3.THINK,
    reasoning_end=kimi_k3.THINK_END, section_start=kimi_k3.TOOLS, section_end=kimi_k3.TOOLS_END,
    call_start=kimi_k3.CALL, call_end=kimi_k3.CALL_END, content_start=kimi_k3.RESP,
    content_end=kimi_k3.RESP_END, assistant_start=kimi_k3.MSG,
    user_start='<|open|>message role="user"<|sep|>',
    preserved_tokens=("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"),
)  # fmt: skip
_GIGACHAT_3 = ChatFormat(
    detector="gigachat_3", tool_mode="json",
    call_start="<|message_sep|>\n\nfunction call<|role_sep|>\n",
    assistant_start="assistant<|role_sep|>", user_start="user<|role_sep|>",
    preserved_tokens=("<|message_sep|>\n\n", "<|role_sep|>\n"), supports_parallel=False,
)  # fmt: skip
_COHERE2_MOE = ChatFormat(
    detector="cohere2_moe", dialect="cohere2_moe", reasoning_mode="tag",
    reasoning_start=cohere2.THINK, reasoning_end=cohere2.THINK_END, content_start=cohere2.TEXT,
    content_end=cohere2.TEXT_END, tool_mode="json", section_start=cohere2.ACTION,
    section_end=cohere2.ACTION_END, array_wrapped=True, name_field="tool_name",
    args_field="parameters", gen_id_field="tool_call_id",
    parameter_order=("tool_call_id", "tool_name", "parameters"),
    assistant_start="<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
    user_start="<|START_OF_TURN_TOKEN|><|USER_TOKEN|>",
    preserved_tokens=("<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|CHATBOT_TOKEN|>",
                      "<|USER_TOKEN|>", "<|SYSTEM_TOKEN|>", cohere2.THINK, cohere2.THINK_END,
                      cohere2.TEXT, cohere2.TEXT_END, cohere2.ACTION, cohere2.ACTION_END,
                      "<|START_TOOL_RESULT|>", "<|END_TOOL_RESULT|>"),
)  # fmt: skip
_FUNCTIONARY_V3_2 = ChatFormat(
    detector="functionary_v3_2", dialect="functionary_v3_2",
    assistant_start="<|start_header_id|>assistant<|end_header_id|>",
    user_start="<|start_header_id|>user<|end_header_id|>", preserved_tokens=(">>>all",),
    trigger_patterns=(">>>(?!all)",),
)  # fmt: skip
_MUSE_GLIMMER = ChatFormat(
    detector="muse_glimmer", dialect="muse_glimmer", reasoning_mode="tag",
    assistant_start="<|start|>assistant", user_start="<|start|>user",
    preserved_tokens=("<|start|>", "<|message|>", "<|eom|>", "<|eot|>", muse.CALLS,
                      "<atem:invoke", "<atem:parameter", muse.PARAM_END, muse.INVOKE_END,
                      muse.CALLS_END),
    trigger_patterns=(r"(?:^|<\|start\|>assistant)( to=(?!self<\|message\|>)"
                      r"(?!user<\|message\|>)[^<]*?<\|message\|>)",),
)  # fmt: skip


def _qwen3_coder(src: str) -> ChatFormat:
    if "<think>" not in src:
        return _QWEN3_CODER
    return _QWEN3_CODER.with_(
        call_start_optional=False,
        reasoning_mode="tag", reasoning_start="<think>", reasoning_end="</think>",
        preserved_tokens=("<tool_call>", "</tool_call>", "<think>", "</think>"),
        thinking_end_tags=("\n</think>", "</think>", "<tool_call>"),
        reasoning_stops=("<tool_call>",),
    )  # fmt: skip


# (detector, test on the source, the format), in llama.cpp's order
SPECIALISED: tuple[tuple[str, Callable[[str], bool], Callable[[str], ChatFormat]], ...] = (
    ("ministral_3", lambda s: all(t in s for t in ("[SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]"))
     and "[CALL_ID]" not in s, lambda s: _MINISTRAL),
    ("gpt_oss", lambda s: "<|channel|>" in s, lambda s: _HARMONY),
    ("muse_glimmer", lambda s: "<atem:function_calls>" in s and "<|eom|>" in s,
     lambda s: _MUSE_GLIMMER),
    ("functionary_v3_2", lambda s: ">>>all" in s and ">>>${recipient}" in s,
     lambda s: _FUNCTIONARY_V3_2),
    ("kimi_k2", lambda s: "<|tool_calls_section_begin|>" in s and "<|tool_call_begin|>" in s,
     lambda s: _KIMI_K2),
    ("kimi_k3", lambda s: all(t in s for t in ("<|open|>", "<|close|>", "<|end_of_msg|>")),
     lambda s: _KIMI_K3),
    ("ling_3", lambda s: "<role>ASSISTANT</role>" in s and "<arg_key>" in s,
     lambda s: _LING_3),
    ("cohere2_moe", lambda s: "<|START_TEXT|>" in s and "<|START_ACTION|>" in s,
     lambda s: _COHERE2_MOE),
    ("lfm2", lambda s: "<|tool_list_start|>" in s and "<|tool_list_end|>" in s,
     lambda s: _lfm2(s, True)),
    ("lfm2_5", lambda s: "List of tools: [" in s and "<|tool_list_start|>" not in s,
     lambda s: _lfm2(s, False)),
    ("gigachat_3", lambda s: "<|role_sep|>" in s and "<|message_sep|>" in s
     and "<|function_call|>" not in s, lambda s: _GIGACHAT_3),
    ("minimax_m3", lambda s: "]<]minimax[>[" in s and "<tool_call>" in s
     and "<invoke name=" in s, lambda s: _MINIMAX_M3),
    ("deepseek_v3_2", lambda s: "dsml_token" in s and "DSML" in s
     and ("function_calls" in s or "tool_calls" in s), _deepseek_v3_2),
    ("gemma_4", lambda s: "'<|tool_call>call:'" in s, lambda s: _GEMMA_4),
    ("minicpm5", lambda s: "Tool usage guidelines:" in s and '<function name="' in s
     and '<param name="' in s, lambda s: _MINICPM5),
    ("qwen3_coder", lambda s: "<tool_call>" in s and "<function=" in s and "<parameter=" in s
     and "'<tool_call><function=' ~ tool_call.name ~ '>'" not in s, _qwen3_coder),
)  # fmt: skip
