"""Failure isolation for one engine step: a request that breaks the step fails alone.

Outside the forward pass (`guarded`, `send_failures`): an exception in one request's
admission, scheduling, detokenization, stop check, grammar or events fails that request
with an error event naming the stage; the step goes on for every other request, and the
waiting queue is never dropped.

A batched forward pass can fail because of one sequence: an exception (a broken adapter,
a shape that hits a bug) or non-finite logits (an adapter with huge weights or scale). An
exception names no culprit, so when a step fails every sequence of the batch runs again
alone, at the same positions (the KV slots the failed step wrote are simply overwritten),
and only those that still fail are failed; every row's result depends on that row alone
(batch-invariant kernels), so the survivors' results are those of the batched step. The
engine zeroes the KV a failed sequence wrote (`scrub_kv`), so that the pool never holds
non-finite values, whoever gets those blocks next.

Invariants: a failed sequence's ``n_computed`` never advances (the engine resets it to its
cached prefix); the fast path (nothing failed) costs one finiteness check of the logits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from loraserve.engine.request import Event, Run
from loraserve.engine.runner import BatchItem, ModelRunner
from loraserve.engine.sampling.chain import SampleResult, sample_batch
from loraserve.engine.sampling.state import SamplerState
from loraserve.kernels.rowops import scan_rows

if TYPE_CHECKING:
    from loraserve.engine.core import EngineCore

log = logging.getLogger("loraserve.engine")
NON_FINITE = "the model produced non-finite logits for this request"
Work = list[tuple[Run, BatchItem]]


@dataclass
class StepOutcome:
    """What survived a step: ``done`` in batch order, ``logits`` [S, V] for those of them
    that want logits (same order), the failed sequences with their error message, and
    per ``done`` item the hidden rows it asked for (embedding requests) or None; ``top``
    [S]: each logits row's first maximum when the finiteness pass found it (else None)."""

    done: Work
    logits: torch.Tensor
    failed: list[tuple[Run, str]] = field(default_factory=list)
    hidden: list[torch.Tensor | None] = field(default_factory=list)
    top: torch.Tensor | None = None


def _bad_rows(logits: torch.Tensor) -> torch.Tensor:
    """[S] bool: rows holding inf or NaN (huge finite logits are not flagged)."""
    return scan_rows(logits.contiguous())[0]


def forward_isolated(runner: ModelRunner, work: Work) -> StepOutcome:
    """One forward over ``work``; if it raises or yields non-finite logits, each sequence
    again alone, failing only those that still raise or yield non-finite logits."""
    try:
        logits = runner.forward([item for _, item in work])
    except Exception as e:  # a broken step fails its culprit, never the engine
        if len(work) == 1:
            return _failed(work[0][0], e)
        reason = f"{type(e).__name__}: {e}"
    else:
        bad, top = scan_rows(logits.contiguous())  # one pass: bad rows, each row's argmax
        if not any(bad.tolist()):  # bool(bad.any()) dispatched 8 torch ops
            return StepOutcome(work, logits, hidden=runner.hidden, top=top)
        if len(work) == 1:
            return StepOutcome([], logits[:0], [(work[0][0], NON_FINITE)])
        reason = "non-finite logits"
    log.warning("batched step failed (%s): running its %d sequences alone", reason, len(work))
    return _one_by_one(runner, work)


def _failed(run: Run, e: Exception) -> StepOutcome:
    log.error("forward pass failed for request %d", run.req.id, exc_info=e)
    return StepOutcome([], torch.empty(0, 0), [(run, f"internal error in the forward pass: {e}")])


def _one_by_one(runner: ModelRunner, work: Work) -> StepOutcome:
    done: Work = []
    rows: list[torch.Tensor] = []
    failed: list[tuple[Run, str]] = []
    hidden: list[torch.Tensor | None] = []
    for run, item in work:
        try:
            logits = runner.forward([item])  # [1 or 0, V]
        except Exception as e:
            failed += _failed(run, e).failed
            continue
        if logits.shape[0] and bool(_bad_rows(logits).any()):
            failed.append((run, NON_FINITE))
            continue
        done.append((run, item))
        rows.append(logits)
        hidden.append(runner.hidden[0])
    vocab = rows[0].shape[1] if rows else 0
    return StepOutcome(done, torch.cat(rows) if rows else torch.empty(0, vocab), failed, hidden)


def sample_isolated(
    logits: torch.Tensor, states: Sequence[SamplerState], top: torch.Tensor | None = None
) -> list[SampleResult | str]:
    """`sample_batch` (``top``: the rows' argmax, if known), or, if it raises, each row
    alone: a row that still raises gets its error message instead of a result."""
    try:
        return list(sample_batch(logits, states, top))
    except Exception:
        log.exception("sampling failed: sampling each request alone")
    out: list[SampleResult | str] = []
    for i, state in enumerate(states):
        try:
            out.append(sample_batch(logits[i : i + 1], [state])[0])
        except Exception as e:
            out.append(f"internal error in sampling: {e}")
    return out


def scrub_kv(runner: ModelRunner, blocks: Sequence[int], start: int) -> None:
    """Zero the KV of positions ``start..`` of a sequence's block table (every layer).

    Positions from a sequence's cached prefix on lie in blocks it owns (new or copied on
    write), so this never touches KV another sequence or the prefix index holds.
    """
    n = len(blocks) * runner.bs
    if start >= n or not runner.kv:
        return
    slots = runner.block_slots(blocks, n)[start:]  # [n - start] flat KV slots
    for k, v in runner.kv:
        k.index_fill_(0, slots, 0)
        v.index_fill_(0, slots, 0)


def guarded(
    core: EngineCore, run: Run, what: str, fn: Callable[..., object], *args: object
) -> bool:
    """``fn(*args)``, or, if it raises, ``run`` fails alone with an error naming ``what``
    (its client gets the error; every other request goes on). Whether it succeeded."""
    try:
        fn(*args)
        return True
    except Exception as e:
        log.exception("request %d failed in %s", run.req.id, what)
        message = f"internal error in {what}: {type(e).__name__}: {e}"
    try:
        core.fail(run, message)
    except Exception:  # last resort: free the slot, send the error
        log.exception("request %d could not be failed cleanly", run.req.id)
        slot = core.scheduler.slots[run.slot] if run.slot >= 0 else None
        if slot is not None and slot.run is run:
            slot.run = None
        core._emit(run, Event(done=True, error=message, id_slot=run.slot))
    return False


def send_failures(core: EngineCore) -> None:
    """Send their error to the requests refused at admission and fail the runs broken while
    scheduling (`Scheduler.take_failures`)."""
    refused, broken = core.scheduler.take_failures()
    for req, message in refused:
        log.error("request %d: %s", req.id, message)
        core._emit(Run(req=req, slot=-1, tokens=[]), Event(done=True, error=message))
    for run, message in broken:
        log.error("request %d: %s", run.req.id, message)
        guarded(core, run, "failing", core.fail, run, message)
