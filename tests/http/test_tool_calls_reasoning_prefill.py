"""A reasoning prefill with tools over HTTP on the tiny model: the last assistant message
holds only `reasoning_content`, so the prompt opens the reasoning and writes it (llama.cpp's
continuation), and the answer continues inside it. Under `required` this was a 500 for
Gemma 4, LFM2 and MiniMax-M3 (their grammars forced the call at once); now the budget ends
the reasoning and a call valid for the schema follows, with the prefill leading
`reasoning_content`. Muse Glimmer's analysis message had no budget (llama.cpp sets no
thinking end tags for it), so the random model wrote it until the token limit and never
called; its budget (`chat.formats.budget`) now forces the message's `<|eom|>`, and the call
follows as for the others (the call's recipient is never forced into the reasoning).
LFM2-8B-A1B's template has no `<think>`, so
llama.cpp extracts no reasoning there: the prefill and its continuation are content.
Command R7B (whose analysed assistant marker, `<|START_RESPONSE|>`, is not in the prompt)
and SmolLM3 (no tool format: the forced call is bare JSON) lost the prefill from
`reasoning_content`."""

from __future__ import annotations

import pytest

from tests.http.tool_call_util import USER, chat, check_calls
from tests.server_util import serve_in_thread
from tests.unit.chat.format_util import TEMPLATES

NAMES = [
    "google-gemma-4-31B-it.jinja", "LFM2.5-8B-A1B.jinja", "LFM2-8B-A1B.jinja",
    "MiniMax-M3.jinja", "muse-glimmer.jinja",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", "HuggingFaceTB-SmolLM3-3B.jinja",
]  # fmt: skip
PREFILL = [*USER, {"role": "assistant", "content": "", "reasoning_content": "Let me"}]


@pytest.fixture(scope="module", params=NAMES)
def srv(request):
    args = ["-np", "1", "-c", "16384", "--chat-template-file", str(TEMPLATES / request.param),
            "--reasoning-budget", "8"]  # fmt: skip
    with serve_in_thread(args) as s:
        s.template_name = request.param
        yield s


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_reasoning_prefill_continues(srv, choice: str) -> None:
    # 1024: Muse's call (XML tags, each argument a run of tokens on the tiny vocabulary)
    # may repeat optional keys up to the grammar's bound and still needs to close
    body = {"messages": PREFILL, "tool_choice": choice, "n_predict": 1024,
            "parallel_tool_calls": False}  # fmt: skip
    choice_ = chat(srv, **body)["choices"][0]
    msg = choice_["message"]
    if srv.template_name == "LFM2-8B-A1B.jinja":
        assert msg["content"].startswith("<think>Let me") and not msg.get("reasoning_content")
    else:
        assert msg["reasoning_content"].startswith("Let me")
        assert " to=" not in msg["reasoning_content"]
    calls = check_calls(choice_)
    if choice == "required":
        assert choice_["finish_reason"] == "tool_calls" and len(calls) == 1
    else:
        assert not calls  # the random model calls nothing by itself
