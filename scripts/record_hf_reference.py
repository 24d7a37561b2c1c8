"""Record transformers' float32 reference outputs for Gemma 3 270M (test data).

transformers loads the GGUF itself (dequantizing to float32), so its forward pass is an
independent oracle for our decoder. Writes tests/data/gemma3_hf_reference.json with the
greedy continuation of a short prompt and the teacher-forced top-1 token at every position
of an ordinary English passage (token ids from our tokenizer, which equals llama.cpp's).
Usage: python scripts/record_hf_reference.py [MODEL.gguf]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from loraserve.model.default import resolve_model_path
from loraserve.model.gguf import GGUFFile
from loraserve.model.tokenizer import Tokenizer

PASSAGE = (
    "The river ran quietly past the old mill, where the miller's daughter sat every morning "
    "with a basket of bread for the travellers who came down from the hills. Some of them were "
    "merchants carrying cloth and spices to the market town, others were pilgrims on their way "
    "to the cathedral, and a few were simply wanderers who had no particular place to go. She "
    "listened to their stories while they ate. One man told her about a city built on water, "
    "where people moved from house to house in narrow boats and the streets were canals. "
    "Another described a desert so wide that it took forty days to cross it on a camel, with "
    "nothing to drink but the water carried in leather bags. A woman from the north spoke of "
    "winters so long and dark that the sun did not rise for weeks, and of summers when it never "
    "set at all. The daughter wrote down everything she heard in a small notebook that her "
    "mother had given her. Years later, when the mill had closed and the travellers no longer "
    "came that way, she read the notebook again and decided to see some of those places for "
    "herself. She sold the basket, packed the notebook, and walked up the road into the hills, "
    "the same road the travellers had taken, and she did not look back."
)
PROMPT = "The capital of France is"


def main() -> None:
    path = resolve_model_path(sys.argv[1] if len(sys.argv) > 1 else None)
    tok = Tokenizer.from_gguf_metadata(GGUFFile(path).metadata)
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, torch_dtype=torch.float32
    ).eval()
    ids = tok.encode(PROMPT)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False)
        greedy = out[0, len(ids) :].tolist()
        passage = tok.encode(PASSAGE)
        logits = model(torch.tensor([passage])).logits[0].float()
        top2 = logits.topk(2, dim=-1)
    data = {
        "prompt": PROMPT,
        "prompt_ids": ids,
        "greedy_ids": greedy,
        "greedy_text": tok.decode(greedy),
        "passage": PASSAGE,
        "passage_ids": passage,
        "top1": top2.indices[:, 0].tolist(),
        "gap": (top2.values[:, 0] - top2.values[:, 1]).tolist(),
    }
    out_path = Path(__file__).resolve().parent.parent / "tests/data/gemma3_hf_reference.json"
    out_path.write_text(json.dumps(data))
    print(f"wrote {out_path}: greedy {data['greedy_text']!r}, {len(passage)} passage tokens")


if __name__ == "__main__":
    main()
