"""Chat rendering as llama.cpp's --jinja path does it: ChatML fallback, Gemma 3 and Llama 3
templates, list-of-parts contents, BOS handling, template helpers and bad messages."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from loraserve.chat.template import (
    CHATML_TEMPLATE,
    ChatTemplateError,
    normalize_messages,
    render_chat,
)

# google/gemma-3-*-it tokenizer_config.json chat_template
GEMMA3 = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

# meta-llama/Meta-Llama-3-8B-Instruct chat_template
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "How are you?"},
]


@pytest.mark.parametrize("template", [None, "", "chatml", CHATML_TEMPLATE])
def test_chatml_fallback(template):
    out = render_chat(template, CHAT, "<bos>", "<eos>")
    assert out == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nHow are you?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_prompt = render_chat(template, CHAT[:2], "<bos>", "<eos>", add_generation_prompt=False)
    assert no_prompt == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"


def test_gemma3():
    out = render_chat(GEMMA3, CHAT, "<bos>", "<eos>")
    assert out == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nHow are you?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    single = render_chat(GEMMA3, [{"role": "user", "content": " Hi \n"}], "<bos>", "<eos>")
    assert single == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"


def test_leading_bos_is_dropped_when_the_tokenizer_adds_it():
    msgs = [{"role": "user", "content": "Hi"}]
    out = render_chat(GEMMA3, msgs, "<bos>", "<eos>", add_bos=True)
    assert out == "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    eos_tmpl = "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"
    assert render_chat(eos_tmpl, msgs, "<s>", "</s>", add_eos=True) == "<s>Hi"
    assert render_chat(eos_tmpl, msgs, "<s>", "</s>", add_bos=True, add_eos=True) == "Hi"


def test_gemma3_refuses_non_alternating_roles():
    msgs = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        render_chat(GEMMA3, msgs, "<bos>", "<eos>")


def test_llama3():
    out = render_chat(LLAMA3, CHAT[:2], "<|begin_of_text|>", "<|eot_id|>")
    assert out == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_list_of_parts_content_is_flattened_where_the_template_reads_strings():
    msgs = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
        }
    ]
    assert render_chat(None, msgs, "", "") == (
        "<|im_start|>user\none\ntwo<|im_end|>\n<|im_start|>assistant\n"
    )
    # Gemma 3's template reads the parts itself (it tests `is string`, then indexes the
    # list): llama.cpp hands it the parts, and it writes their texts one after the other
    assert render_chat(GEMMA3, msgs, "<bos>", "<eos>").startswith(
        "<bos><start_of_turn>user\nonetwo<end_of_turn>"
    )


def test_template_helpers():
    tmpl = (
        "{{ strftime_now('%Y') }}|{{ messages[0] | tojson }}|{{ {'a': [1, 2]} | tojson(indent=1) }}"
        "{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}"
        "{{ m.role }}{% endfor %}"
    )
    msgs = [{"role": "user", "content": "é <b> & 'q'"}, {"role": "x", "content": ""}]
    year, js, indented_and_rest = render_chat(tmpl, msgs, "", "").split("|")
    assert year == str(datetime.now().year)
    assert js == json.dumps(msgs[0], ensure_ascii=False)
    assert indented_and_rest == '{\n "a": [\n  1,\n  2\n ]\n}x'


@pytest.mark.parametrize(
    ("tmpl", "match"),
    [
        ("{% for %}", "does not compile"),
        ("{{ raise_exception('nope') }}", "chat template error: nope"),
        ("{{ ''.__class__.__mro__ }}", "chat template error"),
        ("{{ messages.__class__ }}", "chat template error"),
        ("{{ messages[0]['content'] - 1 }}", "chat template error"),
    ],
)
def test_template_failures_are_chat_template_errors(tmpl, match):
    with pytest.raises(ChatTemplateError, match=match):
        render_chat(tmpl, [{"role": "user", "content": "x"}], "", "")


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ("hi", r"messages: expected a list"),
        (["hi"], r"messages\[0\]: expected an object"),
        ([{"content": "x"}], r"messages\[0\]\.role: missing"),
        ([{"role": 3, "content": "x"}], r"messages\[0\]\.role: must be a string"),
        ([{"role": "user"}], r"messages\[0\]\.content: missing"),
        ([{"role": "user", "content": None}], r"messages\[0\]\.content: missing"),
        ([{"role": "user", "content": 5}], r"messages\[0\]\.content: must be a string"),
        ([{"role": "user", "content": ["x"]}], r"messages\[0\]\.content\[0\]: expected an obj"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            r"messages\[0\]\.content\[0\]: unsupported content part type 'image_url'",
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": 1}]}],
            r"messages\[0\]\.content\[0\]\.text: must be a string",
        ),
    ],
)
def test_bad_messages_name_the_problem(messages, match):
    with pytest.raises(ValueError, match=match):
        render_chat(None, messages, "", "")


def test_assistant_without_content_and_extra_keys():
    msgs = [
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "user", "content": "x", "name": "n"},
    ]
    assert normalize_messages(msgs) == [
        {"role": "assistant", "content": "", "tool_calls": []},
        {"role": "user", "content": "x", "name": "n"},
    ]
    assert msgs[0]["content"] is None
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}]}]
    assert normalize_messages(parts) == parts  # parts are kept: a template may read them
