"""The log line of a finished request (`request_line`)."""

from __future__ import annotations

from loraserve.engine.request import Run, StopType
from loraserve.lora.registry import AdapterRegistry


def request_line(run: Run, stop: StopType, adapters: AdapterRegistry) -> str:
    """The log line of a finished request: id, slot, adapter mix, prompt tokens (cached and
    evaluated), generated tokens, speeds and why it stopped."""
    t = run.timings.as_dict()
    names = {a.id: a.name for a in adapters.list()}
    mix = ", ".join(f"{names.get(i, i)}={s:g}" for i, s in sorted(run.req.mix.scales.items()))
    return (
        f"request {run.req.id} slot {run.slot} mix [{mix or 'base'}]: prompt {run.n_prompt} "
        f"tokens ({run.n_cached} cached, {t['prompt_n']} evaluated, "
        f"{t['prompt_per_second']:.1f} tok/s), generated {len(run.generated)} tokens "
        f"({t['predicted_per_second']:.1f} tok/s), stop {stop}"
    )
