"""Chat on the real default model (Gemma 3 270M, whose file has no chat template) over
HTTP: the `gemma` fallback with a warning at start (its turn markers are the model's own
control tokens), `--chat-template NAME`, `--chat-template-file` with `chat_template_kwargs`,
and answers free of ChatML markers (the 270M base model is not instruction-tuned: what it
answers is not checked)."""

from __future__ import annotations

import logging

import pytest

from loraserve.model.loader import load_model
from tests.server_util import serve_in_thread

MSGS = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is the capital of France?"},
]
GEMMA = (
    "<start_of_turn>user\nAnswer briefly.\n\nWhat is the capital of France?<end_of_turn>\n"
    "<start_of_turn>model\n"
)


@pytest.fixture(scope="module")
def model(real_model_path):
    return load_model(real_model_path)


def serve(model, *args: str):
    return serve_in_thread(["-m", str(model.path), "-np", "1", "-c", "512", *args], model=model)


def test_default_model_chats_in_gemma_format(model, caplog) -> None:
    assert model.tokenizer.chat_template is None
    with caplog.at_level(logging.WARNING, logger="loraserve.server"), serve(model) as s:
        assert s.client.get("/props").json()["chat_template"] == "gemma"
        prompt = s.client.post("/apply-template", json={"messages": MSGS}).json()["prompt"]
        assert prompt == GEMMA
        body = {"messages": MSGS, "max_tokens": 24, "temperature": 0}
        r = s.client.post("/v1/chat/completions", json=body).json()
        answer = r["choices"][0]["message"]["content"]
        assert "<|im_start|>" not in answer and "im_start" not in answer
        assert "<start_of_turn>" not in answer and answer.strip()
        pieces = s.client.post("/tokenize", json={"content": prompt, "with_pieces": True}).json()
        turns = [t["id"] for t in pieces["tokens"] if t["piece"] == "<start_of_turn>"]
        assert len(turns) == 2 and len(set(turns)) == 1  # the model's own control token
    warned = [m for m in caplog.messages if "no chat template" in m]
    assert len(warned) == 1 and "gemma" in warned[0]


def test_named_and_file_templates(model, tmp_path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="loraserve.server"):
        with serve(model, "--chat-template", "chatml") as s:
            prompt = s.client.post("/apply-template", json={"messages": MSGS[1:]}).json()
            assert prompt["prompt"] == (
                "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                "<|im_start|>assistant\n"
            )
    assert not any("no chat template" in m for m in caplog.messages)
    tmpl = tmp_path / "t.jinja"
    tmpl.write_text(
        "{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n"
        "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n"
        "{% if terse %}In one word:{% endif %}{% endif %}"
    )
    with serve(
        model, "--chat-template-file", str(tmpl), "--chat-template-kwargs", '{"terse": 1}'
    ) as s:
        plain = s.client.post("/apply-template", json={"messages": MSGS[1:]}).json()["prompt"]
        assert plain.endswith("<start_of_turn>model\nIn one word:")
        off = {"messages": MSGS[1:], "chat_template_kwargs": {"terse": False}}
        assert s.client.post("/apply-template", json=off).json()["prompt"].endswith("model\n")
        body = {**off, "max_tokens": 4, "temperature": 0}
        assert s.client.post("/v1/chat/completions", json=body).status_code == 200
