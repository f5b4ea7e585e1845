"""helpers.roofs: the measured roofs, a kernel's place under them, and the reasons they allow."""
import math

import pytest
import torch

from helpers import roofs
from helpers.precision import Advice
from helpers.timing import Comparison

ROOFS = roofs.Roofs({"float32": 100e9, "bfloat16": 250e9}, {"float32": 512, "bfloat16": 512},
                    20e9, 1)
N = 4096


def batch_1(dtype: str, seconds: float) -> roofs.Kernel:
    return roofs.Kernel(dtype, 2 * N * N, N * N * (4 if dtype == "float32" else 2), seconds)


def result(ratio: float, low: float, high: float, verdict: str = "faster") -> Comparison:
    return Comparison(ratio, low, high, verdict, 1.0, 1.0, 1)


def test_best_seconds_is_the_best_of_its_runs(monkeypatch):
    times = iter([0.001, 0.004, 0.002, 0.003])  # the warm-up, then three runs
    monkeypatch.setattr(roofs.timing, "seconds_per_call", lambda fn, calls, sync: next(times))
    assert roofs.best_seconds(lambda: None) == 0.002


def test_measured_roofs_are_sized_by_time_and_positive():
    measured = roofs.measure((torch.float32,), threads=1)
    assert measured.compute["float32"] > 1e8 and measured.bandwidth > 1e8  # any CPU of the course
    assert 128 <= measured.gemm_n["float32"] <= roofs.MAX_N
    assert torch.get_num_threads() >= 1 and measured.threads == 1


def test_a_kernel_is_placed_against_the_roof_at_its_intensity():
    memory_speed = batch_1("float32", N * N * 4 / 20e9)  # reads its weights at the read roof
    assert memory_speed.fraction(ROOFS) == pytest.approx(1.0)
    assert "100% of its memory roof" in memory_speed.describe(ROOFS)
    busy = roofs.Kernel("bfloat16", 1e12, 1e9, 8.0)  # 1000 FLOP/byte: past the ridge (12.5)
    assert busy.fraction(ROOFS) == pytest.approx(0.5) and "compute roof" in busy.describe(ROOFS)


def test_a_reason_only_where_the_fractions_give_one():
    at_roof_32, at_roof_16 = batch_1("float32", N * N * 4 / 20e9), batch_1("bfloat16", N * N * 2 / 20e9)
    as_predicted = roofs.reason(result(2.0, 1.8, 2.2), at_roof_32, at_roof_16, ROOFS)
    assert as_predicted.startswith("as the roofs predict") and "allow 2.00x" in as_predicted
    slow_32 = batch_1("float32", 4 * N * N * 4 / 20e9)  # at a quarter of its roof
    text = roofs.reason(result(4.0, 3.5, 4.6), slow_32, at_roof_16, ROOFS)
    assert "this float32 kernel runs far below its roof" in text and "float32 at 25%" in text
    slow_16 = batch_1("bfloat16", 4 * N * N * 2 / 20e9)
    assert "bfloat16 kernel runs far below" in roofs.reason(result(0.5, 0.4, 0.6, "slower"),
                                                             at_roof_32, slow_16, ROOFS)
    mild = batch_1("float32", 1.5 * N * N * 4 / 20e9)  # 67 %: not far below, yet above 2x
    assert roofs.reason(result(3.0, 2.6, 3.3), mild, at_roof_16, ROOFS).startswith("unexplained here")
    above = batch_1("bfloat16", N * N * 2 / 20e9 / 3)  # three times the read roof
    assert "above the roof" in roofs.reason(result(6.0, 5, 7), at_roof_32, above, ROOFS)
    unclear = roofs.reason(result(1.0, 0.8, 1.2, "no clear difference"), at_roof_32, above, ROOFS)
    assert unclear == "no reason given: no clear difference"


def test_expected_by_rule_maps_the_advice_to_what_against_rule_takes():
    pick = Advice(torch.bfloat16, "16-bit weights", "native")
    assert roofs.expected_by_rule(pick, torch.bfloat16, "16-bit weights") == "faster"
    assert roofs.expected_by_rule(pick, torch.bfloat16, "autocast") is None
    assert roofs.expected_by_rule(pick, torch.float16) is None
    assert roofs.expected_by_rule(Advice(None, "measure", "?"), torch.bfloat16) is None
    assert roofs.expected_by_rule(Advice(torch.float32, "float32", "AVX2"), torch.float16) == "no gain"
    assert math.isclose(ROOFS.ridge("bfloat16"), 12.5)
