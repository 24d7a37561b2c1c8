"""The sampler's row-wise kernels over a large vocabulary: the chunked top-k, the C pass
over the logits (argmax and inf/NaN rows, `kernels.rowops.scan_rows`) and the bias-only
greedy shortcut, each against torch's own answer."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loraserve.engine.sampling.chain import adjusted_logits, sample_batch
from loraserve.engine.sampling.ops import fast_argmax, fast_topk
from loraserve.kernels.rowops import scan_rows
from tests.unit.sampling.sampling_util import state

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(
    rows=st.integers(1, 4),
    vocab=st.integers(1, 3000),
    k=st.integers(1, 64),
    seed=st.integers(0, 2**31),
)
def test_fast_topk_equals_torch(rows: int, vocab: int, k: int, seed: int) -> None:
    k = min(k, vocab)
    x = torch.stack([torch.randperm(vocab, generator=torch.Generator().manual_seed(seed + r))
                     for r in range(rows)]).float()  # fmt: skip
    vals, ids = fast_topk(x, k)
    ref_vals, ref_ids = torch.topk(x, k)
    assert torch.equal(vals, ref_vals) and torch.equal(ids, ref_ids)


@FAST
@given(vocab=st.integers(1, 3000), levels=st.integers(1, 5), seed=st.integers(0, 2**31))
def test_fast_argmax_first_occurrence(vocab: int, levels: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, levels, (3, vocab), generator=g).float()  # many ties
    assert torch.equal(fast_argmax(x), x.argmax(-1))


@FAST
@given(
    rows=st.integers(1, 3),
    vocab=st.sampled_from([1, 7, 8, 9, 100, 40_001, 70_000]),
    levels=st.integers(1, 4),
    seed=st.integers(0, 2**31),
)
def test_scan_rows_flags_and_argmax_equal_torch(
    rows: int, vocab: int, levels: int, seed: int
) -> None:
    """The C pass (one row split across threads, or rows across threads) gives torch's
    argmax on finite rows, ties and signed zeros included, and flags exactly the rows with
    inf or NaN."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, levels, (rows, vocab), generator=g).float() - 1.0
    x[x == 0] = -0.0  # a signed zero ties with +0.0, as in torch.argmax
    assert torch.equal(fast_argmax(x), x.argmax(-1))
    bad_rows = torch.randint(0, 2, (rows,), generator=g).bool()
    for r in bad_rows.nonzero().flatten().tolist():
        col = int(torch.randint(0, vocab, (1,), generator=g))
        x[r, col] = [float("inf"), -float("inf"), float("nan")][col % 3]
    bad, _ = scan_rows(x)
    assert bad.tolist() == bad_rows.tolist()
    assert torch.equal(fast_argmax(x), x.argmax(-1))  # rows with NaN: torch's own answer


@FAST
@given(
    vocab=st.integers(2, 300),
    levels=st.integers(1, 4),
    n_bias=st.integers(1, 6),
    seed=st.integers(0, 2**31),
)
def test_greedy_under_distinct_biases_equals_the_biased_row(
    vocab: int, levels: int, n_bias: int, seed: int
) -> None:
    """The bias-only greedy shortcut (no copy of the row) picks the first maximum of the
    biased row, whether or not the raw top token is biased, with ties between biased and
    unbiased tokens."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, levels, (2, vocab), generator=g).float()
    ids = torch.randperm(vocab, generator=g)[: min(n_bias, vocab)].tolist()
    choices = [False, -1.0, 1.0, 0.0, 2.5]
    bias = tuple((t, choices[int(torch.randint(0, 5, (1,), generator=g))]) for t in ids)
    states = [state(temperature=0, logit_bias=bias), state(temperature=0)]
    assert states[0].bias_greedy
    want = adjusted_logits(x, states).argmax(-1).tolist()
    assert [r.token for r in sample_batch(x, states)] == want


def test_full_vocabulary_probabilities_do_not_depend_on_the_batch() -> None:
    """With 2 threads torch splits one long row's reduction across them but keeps each of
    several rows on one thread: the n_probs softmax (over 262,144 logits) and top_p's full
    row mass must still give a row the same bits alone and in a batch."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        g = torch.Generator().manual_seed(3)
        x = torch.randn(16, 262_144, generator=g) * 6
        probs = [state(temperature=0, n_probs=5) for _ in range(16)]
        batch = sample_batch(x, probs)
        for r in range(16):
            (alone,) = sample_batch(x[r : r + 1], [probs[r]])
            assert (alone.probs, alone.prob) == (batch[r].probs, batch[r].prob), f"row {r}"

        def nucleus() -> list:
            return [state(temperature=0.8, top_k=0, top_p=0.95, seed=r) for r in range(16)]

        together = [s.token for s in sample_batch(x, nucleus())]
        alone_tokens = [sample_batch(x[r : r + 1], [s])[0].token for r, s in enumerate(nucleus())]
        assert together == alone_tokens
    finally:
        torch.set_num_threads(threads)
