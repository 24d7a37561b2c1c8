// The ChatML template loraserve falls back to when the model has none (chat/template.py,
// CHATML_TEMPLATE; tests/test_webui.py checks the two are equal). /props reports it as the
// chat_template then: the page says the model has no template of its own.
export const CHATML_FALLBACK = "{%- for message in messages -%}\n  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n  {{- '<|im_start|>assistant\n' -}}\n{%- endif -%}";
