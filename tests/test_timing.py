"""helpers.timing, the course's timing method (notebook 01 §4 types the same code: tests/test_copies.py): it runs both
variants at the requested thread count and restores the old one (even on error), and its verdict reads a ratio's
median and spread as faster, slower or no clear difference."""
from __future__ import annotations

import time

import pytest
import torch

from helpers import timing


def test_compare_runs_both_variants_at_the_requested_threads_and_restores_them():
    before = torch.get_num_threads()
    requested = 1 if before != 1 else 2
    seen = {"baseline": set(), "candidate": set()}

    def baseline():
        seen["baseline"].add(torch.get_num_threads())

    def candidate():
        seen["candidate"].add(torch.get_num_threads())

    result = timing.compare(baseline, candidate, threads=requested, rounds=3, round_s=0.001)
    assert seen == {"baseline": {requested}, "candidate": {requested}}
    assert result.threads == requested
    assert torch.get_num_threads() == before


def test_compare_without_threads_runs_at_the_current_count():
    seen = set()
    result = timing.compare(lambda: seen.add(torch.get_num_threads()), lambda: None, rounds=3, round_s=0.001)
    assert seen == {torch.get_num_threads()} and result.threads == torch.get_num_threads()


def test_compare_restores_the_threads_when_a_variant_raises():
    before = torch.get_num_threads()
    requested = 1 if before != 1 else 2

    def broken():
        raise RuntimeError("a variant that fails")

    with pytest.raises(RuntimeError, match="a variant that fails"):
        timing.compare(lambda: None, broken, threads=requested, rounds=3, round_s=0.001)
    assert torch.get_num_threads() == before


def test_compare_pairs_and_interleaves_the_rounds():
    order = []
    timing.compare(lambda: order.append("a"), lambda: order.append("b"), rounds=4, round_s=1e-9)
    # one call per round (round_s is tiny): a warm-up and 3 calibrations each, then a b | b a | a b | b a
    assert "".join(order) == "aaaabbbb" + "abbaabba"


def test_compare_ratio_is_baseline_time_over_candidate_time():
    """Sleeps take their time on a busy machine too: 4 ms against 2 ms is about 2x, candidate faster."""
    def slow():
        time.sleep(0.004)

    def fast():
        time.sleep(0.002)

    faster = timing.compare(slow, fast, rounds=5, round_s=0.004)
    assert 1.5 < faster.ratio < 2.5 and faster.verdict == "faster"
    assert faster.low <= faster.ratio <= faster.high
    assert faster.baseline_s > faster.candidate_s
    slower = timing.compare(fast, slow, rounds=5, round_s=0.004)
    assert 0.4 < slower.ratio < 0.67 and slower.verdict == "slower"


@pytest.mark.parametrize("ratios, expected", [
    ([1.5, 1.6, 1.4, 1.55, 1.45], "faster"),
    ([0.5, 0.55, 0.45, 0.6, 0.52], "slower"),
    ([1.05, 1.02, 1.08, 1.04, 1.06], "no clear difference"),  # clear of 1, but within the 10 % margin
    ([0.95, 0.97, 0.93, 0.96, 0.94], "no clear difference"),
    ([0.5, 0.7, 0.9, 1.3, 1.8, 2.2, 3.0], "no clear difference"),  # median 1.3, but a noisy, wide spread
    ([2.3, 2.5, 3.0, 10.0, 50.0, 100.0, 226.0], "no clear difference"),  # all above 1, but a stalling machine
    ([18.0, 19.0, 20.0, 20.0, 21.0, 22.0, 40.0], "faster"),  # a large gap measured steadily (one outlier)
    ([0.3, 0.6, 0.8, 0.85, 1.1, 1.4, 2.0], "no clear difference"),  # median 0.85, the upper quartile above 1
    ([1.2, 1.3, 1.25, 0.4, 1.22, 1.28, 1.26], "faster"),  # one slow round does not flip a clear result
])
def test_verdict_on_constructed_ratios(ratios, expected):
    assert timing.verdict(ratios, margin=0.1) == expected


def test_verdict_margin_is_symmetric_in_log_scale():
    assert timing.verdict([1.1] * 5, margin=0.1) == "faster"
    assert timing.verdict([1 / 1.1] * 5, margin=0.1) == "slower"
    assert timing.verdict([1.09] * 5, margin=0.1) == "no clear difference"


def test_comparison_prints_median_spread_verdict_and_threads():
    result = timing.Comparison(ratio=1.454, low=1.2, high=1.83, verdict="faster", baseline_s=0.2,
                               candidate_s=0.14, threads=2)
    assert str(result) == "1.45x (faster; rounds 1.20-1.83x, 2 threads)"


def test_synchronizer_on_the_cpu_does_nothing():
    assert timing.synchronizer("cpu")() is None
