"""Checks of the saved demo adapters with transformers + PEFT and with llama-server."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from demo_model import generate  # noqa: E402
from demo_prompts import EVAL_NEW_TOKENS  # noqa: E402

from loraserve.adapters import (  # noqa: E402
    ADAPTERS_DIR,
    STYLE_CHECK,
    STYLE_SCORE,
    uppercase_fraction,
)

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
