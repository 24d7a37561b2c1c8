"""bench.arch_speed's arithmetic (no server): CPU per token and the ratios."""

from __future__ import annotations

import pytest

from bench.arch_speed import _cpu_per_token, compare
from bench.servers import CLK_TCK


def test_cpu_per_token_charges_decode_prompts_at_the_prefill_rate() -> None:
    pre = {"runs": [{"prompt_n": 512}] * 2}  # 1024 prompt tokens
    dec = {"runs": [{"n_tokens": 128}] * 2}  # 256 generated after 2 x 100-token prompts
    pre_j, dec_j = int(1.024 * CLK_TCK), int(2.76 * CLK_TCK)  # 1 ms a prompt token
    cpu = _cpu_per_token(pre_j, dec_j, pre, dec, 100)
    assert cpu["prefill"] == pytest.approx(1.0, rel=0.02)
    assert cpu["decode"] == pytest.approx((2760 - 200) / 256, rel=0.02)  # 10 ms a token


def test_compare_ratios_are_ours_over_theirs_and_cpu_theirs_over_ours() -> None:
    peer = {"prefill_tok_s": 100.0, "decode_tok_s": 10.0, "cpu_ms": {"prefill": 4.0, "decode": 90}}
    ours = {"prefill_tok_s": 150.0, "decode_tok_s": 12.0, "cpu_ms": {"prefill": 2.0, "decode": 60}}
    c = compare(peer, ours)
    assert c["prefill_ratio"] == 1.5 and c["decode_ratio"] == pytest.approx(1.2)
    assert c["prefill_cpu_ratio"] == 2.0 and c["decode_cpu_ratio"] == 1.5
    assert c["prefill_meets_target"] and c["decode_meets_target"]
