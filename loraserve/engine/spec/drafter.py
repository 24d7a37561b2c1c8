"""The speculator: which running sequences draft this step, how many tokens, from which
type, and what their verification taught (acceptance counters, adaptive back-off).

Drafts are proposals only: the engine verifies a sequence's draft as extra rows of its
decode item in the batched step, under the sequence's own adapter mix, and keeps exactly
the tokens that sampling the target model row by row would have produced (`EngineCore`'s
verification). So a draft can only change speed, never an answer.

Adaptive back-off (so that speculation costs little where it does not help):
- a sequence whose draft was wholly rejected drafts again only after ``backoff`` steps,
  doubling on each further rejection (up to `MAX_BACKOFF`), reset by an accepted token;
- a sequence's draft length is capped: at first `FIRST_CAP` tokens, doubled (2c + 1, so
  that the rows of a step come in eights, what the kernels share a weight read across)
  each time a draft is accepted in full, cut to what was accepted (at least `FIRST_CAP`)
  when part of it is, halved when none of it is;
- a limit of `FIRST_CAP` or more is rounded down so that the draft and its decode row make
  a multiple of 4 rows: the kernels run 8 and 4 rows against each weight read, and a tail
  row costs a whole pass (measured, Gemma 270M: 17 rows 93.6 ms, 16 rows 83.9 ms, 15 rows
  93.1 ms);
- with more than `MAX_BATCH` sequences decoding no one drafts (the step's rows already share
  its weight reads), and the drafts of one step fit the token budget left after one row
  per decoding sequence, and at most `MAX_DRAFT_ROWS` rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from loraserve.engine.request import Run
from loraserve.engine.spec.config import SpecConfig
from loraserve.engine.spec.ngram import ModPools, TokenBytes, ngram_simple_draft

MAX_BACKOFF = 16  # steps a sequence waits at most after rejected drafts
MAX_BATCH = 8  # more sequences decoding than this: no drafts
MAX_DRAFT_ROWS = 64  # draft rows per step, all sequences together
FIRST_CAP = 7  # a sequence's first drafts: at most this long

# a draft model's proposer: (runs, their maximum lengths) -> one draft per run
DraftFn = Callable[[list[Run], list[int]], list[list[int]]]


@dataclass
class SpecRun:
    """One sequence's speculation state and counters (`Run.spec`)."""

    n_drafted: int = 0  # draft tokens verified (timings.draft_n)
    n_accepted: int = 0  # of them, accepted (timings.draft_n_accepted)
    n_verified: int = 0  # verification steps
    fed: int = 0  # n-gram starts already added to the ngram-mod pool
    skip: int = 0  # steps left without drafting (back-off)
    backoff: int = 1
    cap: int = FIRST_CAP  # adaptive draft length cap
    packed: TokenBytes = field(default_factory=TokenBytes)  # the tokens, for ngram-simple


class Speculator:
    """Proposes drafts for decoding sequences (`propose`) and learns from their
    verification (`record`). ``draft_model`` proposes the `draft-simple` drafts."""

    def __init__(self, config: SpecConfig, n_ctx_slot: int, draft_model: DraftFn | None = None):
        self.config = config
        self.n_ctx_slot = n_ctx_slot
        self.mod = ModPools(config.ngram_mod_n_match)
        self.draft_model = draft_model

    def eligible(self, run: Run) -> bool:
        """Whether a sequence may draft at all (decoding and sampled; a grammar's mask is
        applied to each verified row in turn, after the tokens before it)."""
        req = run.req
        return (
            not run.prefilling
            and run.sampler is not None
            and req.pooling is None
            and (req.spec is None or req.spec.n_max != 0)
        )

    def _limit(self, run: Run, kind: str) -> int:
        """The longest draft ``run`` may verify now under type ``kind``."""
        req, cfg = run.req, self.config
        n = cfg.type_n_max(kind)
        if req.spec is not None and req.spec.n_max is not None:
            n = min(n, req.spec.n_max)
        if req.max_tokens >= 0:
            n = min(n, req.max_tokens - len(run.generated) - 1)  # room for the bonus token
        n = min(n, self.n_ctx_slot - len(run.tokens) - 1)
        if cfg.adaptive and run.spec is not None:  # never below n_min: that would stop it
            n_min = self._n_min(run, kind)
            n = min(n, max(run.spec.cap, n_min))
            aligned = (n + 1) // 4 * 4 - 1  # draft + the decode row: a multiple of 4 rows
            if n >= FIRST_CAP and aligned >= n_min:
                n = aligned
        return max(n, 0)

    def _n_min(self, run: Run, kind: str) -> int:
        req = run.req
        if req.spec is not None and req.spec.n_min is not None:
            return req.spec.n_min
        return self.config.ngram_mod_n_min if kind == "ngram-mod" else self.config.draft_n_min

    def propose(self, runs: Sequence[Run], budget: int) -> None:
        """Set ``run.draft`` for every decoding sequence of ``runs`` (empty: no draft), within
        ``budget`` token rows for the step (one row per decoding sequence included)."""
        decoding = [r for r in runs if not r.prefilling]
        for run in decoding:
            run.draft = []
        cfg = self.config
        if cfg.adaptive and len(decoding) > MAX_BATCH:
            return
        rows = min(budget - len(decoding), MAX_DRAFT_ROWS)
        todo: list[Run] = []
        for run in decoding:
            if not self.eligible(run):
                continue
            if run.spec is None:
                run.spec = SpecRun()
            if "ngram-mod" in cfg.types:
                self._feed(run)
            if cfg.adaptive and run.spec.skip > 0:
                run.spec.skip -= 1
                continue
            todo.append(run)
        ngram = [k for k in cfg.types if k != "draft-simple"]
        if ngram and rows > 0 and todo:
            todo, rows = self._ngrams(ngram, todo, rows)
        if "draft-simple" in cfg.types and rows > 0 and todo:
            todo, rows = self._draft_model(todo, rows)

    def _ngrams(self, kinds: list[str], runs: list[Run], rows: int) -> tuple[list[Run], int]:
        """Model-free drafts: each run takes the longest of its n-gram types' drafts (the
        first type on a tie). Where the text repeats with a short period, ngram-simple's
        draft stops where its match runs into the present while ngram-mod's chain goes on:
        measured on the copy-heavy bench, a log that the model copied in a 10-token loop
        drafted 9 tokens a step instead of 23. Returns the runs still without a draft and
        the rows left."""
        left: list[Run] = []
        for run in runs:
            best: list[int] = []
            for kind in kinds:
                d = self._ngram(kind, run, min(self._limit(run, kind), rows))
                if len(d) > len(best) and len(d) >= max(self._n_min(run, kind), 1):
                    best = d
            if not best:
                left.append(run)
                continue
            run.draft = best
            rows -= len(best)
        return left, rows

    def _draft_model(self, runs: list[Run], rows: int) -> tuple[list[Run], int]:
        """The draft model's drafts (`draft-simple`), for the runs no n-gram drafted for."""
        if self.draft_model is None:
            return runs, rows
        limits = [min(self._limit(r, "draft-simple"), rows) for r in runs]
        asked = [(r, n) for r, n in zip(runs, limits, strict=True) if n > 0]
        drafts = self.draft_model([r for r, _ in asked], [n for _, n in asked])
        found = dict(zip([id(r) for r, _ in asked], drafts, strict=True))
        left: list[Run] = []
        for run in runs:
            d = found.get(id(run), [])[: max(rows, 0)]
            if len(d) < max(self._n_min(run, "draft-simple"), 1):
                left.append(run)
                continue
            run.draft = d
            rows -= len(d)
        return left, rows

    def _ngram(self, kind: str, run: Run, limit: int) -> list[int]:
        if limit <= 0:
            return []
        cfg = self.config
        if kind == "ngram-simple":
            assert run.spec is not None
            run.spec.packed.sync(run.tokens)
            n, m = cfg.ngram_simple_size_n, cfg.ngram_simple_size_m
            return ngram_simple_draft(run.tokens, n, m, run.spec.packed)[:limit]
        pool = self.mod.get(run.req.cache_key)
        return pool.draft(run.tokens, self._n_min(run, kind), limit)

    def _feed(self, run: Run) -> None:
        """Add the sequence's new n-grams to its cache key's ngram-mod pool."""
        assert run.spec is not None
        pool = self.mod.get(run.req.cache_key)
        pool.add(run.tokens, run.spec.fed, len(run.tokens))
        run.spec.fed = max(len(run.tokens) - pool.n, run.spec.fed)

    def record(self, run: Run, n_draft: int, n_accepted: int) -> None:
        """A verified draft: ``n_accepted`` of its ``n_draft`` tokens were the target's (the
        counters are `verify`'s; this adapts the back-off and the cap)."""
        s = run.spec
        if s is None or n_draft == 0:
            return
        if n_accepted == 0:
            s.skip, s.backoff = s.backoff, min(s.backoff * 2, MAX_BACKOFF)
            s.cap = max(1, n_draft // 2)
        else:
            s.backoff = 1
            full = n_accepted == n_draft
            s.cap = 2 * max(s.cap, n_draft) + 1 if full else max(n_accepted, FIRST_CAP)

    def drop(self, pred: object) -> None:
        """Forget the n-gram pools of cache keys satisfying ``pred`` (an adapter unloaded)."""
        self.mod.drop(pred)
