"""helpers.roofs: the measured roofs, a kernel's place under them, and the reasons they allow."""
import math
from types import SimpleNamespace

import pytest
import torch

from helpers import roofs
from helpers.precision import Advice
from helpers.timing import Comparison

ROOFS = roofs.Roofs({"float32": 100e9, "bfloat16": 250e9}, {"float32": 512, "bfloat16": 512},
                    20e9, 1, emulated=("float16",))
N = 4096
ZEN4 = {"device": "cpu", "torch": "2.4.1", "arch": "x86_64", "system": "Linux",
        "flags": ["avx512f", "avx512_bf16"]}  # bf16 native (AVX512-BF16), fp16 emulated


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
    assert roofs.MIN_N <= measured.gemm_n["float32"] <= roofs.MAX_N_CPU
    assert measured.threads == 1 and measured.read.threads == 1


def test_an_emulated_dtype_gets_no_roof_by_the_documented_flags(monkeypatch):
    monkeypatch.setattr(roofs, "_gemm", lambda dtype, device, threads: (1e11, 1024))
    monkeypatch.setattr(roofs, "_read_roof", lambda device, threads: roofs.ReadRoof((2e10,), 1, 1))
    measured = roofs.measure(threads=1, description=ZEN4)
    assert set(measured.compute) == {"float32", "bfloat16"} and measured.emulated == ("float16",)
    assert "float16: emulated here" in str(measured) and "\n  float16 GEMM" not in str(measured)
    fast = roofs.Kernel("float16", 2 * N * N, 2 * N * N, 1e-3)  # 33 GB/s: any speed, no roof
    assert roofs.classify(fast, measured) == "no roof"
    assert "no roof here, the kernel decides" in fast.describe(measured)
    assert "%" not in fast.describe(measured) and "ridge" not in fast.describe(measured)
    text = roofs.reason(result(2.0, 1.8, 2.2), batch_1("float32", 0.01), fast, measured)
    assert text == "no roof here for float16 (emulated): the kernel decides"
    amx_fp16 = {**ZEN4, "flags": ["avx512f", "amx_bf16", "amx_fp16"]}
    assert roofs.has_roof(torch.float16, amx_fp16) and not roofs.has_roof(torch.float16, ZEN4)


def test_the_batch_4_linear_is_memory_bound_against_the_measured_ridge():
    measured = roofs.Roofs({"float32": 206e9, "bfloat16": 440e9}, {}, 28.5e9, 2)  # ridge 7.2
    flops, nbytes = 2 * 4 * N * N, (N * N + 8 * N) * 4  # weights, 4 inputs and 4 outputs
    linear = roofs.Kernel("float32", flops, nbytes, nbytes / 9.5e9)  # streams at 9.5 GB/s
    assert linear.intensity == pytest.approx(2, rel=0.01) and measured.ridge("float32") > 7
    assert roofs.classify(linear, measured) == "memory-bound"
    assert linear.fraction(measured) == pytest.approx(9.5 / 28.5)  # of the read roof
    assert "memory-bound: 33% of its roof (far below it)" in linear.describe(measured)
    square = roofs.Kernel("float32", 2 * 1024**3, 3 * 1024**2 * 4, 0.01)  # 171 FLOP/byte
    assert roofs.classify(square, measured) == "compute-bound"


def test_a_reason_only_where_the_fractions_give_one():
    at_roof_32, at_roof_16 = batch_1("float32", N * N * 4 / 20e9), batch_1("bfloat16", N * N * 2 / 20e9)
    as_predicted = roofs.reason(result(2.0, 1.8, 2.2), at_roof_32, at_roof_16, ROOFS)
    assert as_predicted.startswith("as the roofs predict") and "allow 2.00x" in as_predicted
    slow_16 = batch_1("bfloat16", 4 * N * N * 2 / 20e9)
    assert "bfloat16 kernel runs far below" in roofs.reason(result(0.5, 0.4, 0.6, "slower"),
                                                             at_roof_32, slow_16, ROOFS)
    mild = batch_1("float32", 1.5 * N * N * 4 / 20e9)  # 67 %: not far below, yet above 2x
    assert roofs.reason(result(3.0, 2.6, 3.3), mild, at_roof_16, ROOFS).startswith("unexplained here")
    above = batch_1("bfloat16", N * N * 2 / 20e9 / 3)  # three times the read roof
    assert "above its measured roof" in roofs.reason(result(6.0, 5, 7), at_roof_32, above, ROOFS)
    unclear = roofs.reason(result(1.0, 0.8, 1.2, "no clear difference"), at_roof_32, above, ROOFS)
    assert unclear == "no reason given: no clear difference"


def test_no_roof_reason_when_the_baseline_runs_far_below_its_own_roof():
    slow_32 = batch_1("float32", 4 * N * N * 4 / 20e9)  # at a quarter of its roof
    at_roof_16 = batch_1("bfloat16", N * N * 2 / 20e9)
    text = roofs.reason(result(4.0, 3.5, 4.6), slow_32, at_roof_16, ROOFS)
    assert text.startswith("the roofs do not explain this ratio") and "float32 at 25%" in text
    both_slow = batch_1("bfloat16", 3 * N * N * 2 / 20e9)  # a third of its roof; 1.33x, 2x allowed
    text = roofs.reason(result(1.33, 1.25, 1.4), slow_32, both_slow, ROOFS)
    assert text.startswith("the roofs do not explain this ratio") and "predict" not in text


def test_the_read_roof_is_measured_once_per_process_with_its_spread(monkeypatch):
    roofs._read_roof.cache_clear()
    monkeypatch.setattr(roofs, "stream_bytes", lambda device: 1 << 20)
    first = roofs.read_roof(threads=1)
    assert roofs.read_roof(threads=1) is first and len(first.rates) == roofs.READS
    assert first.best == max(first.rates) and "the best of 25 reads of 1 MiB" in str(first)
    assert "median" in str(first) and "slowest" in str(first)
    roofs._read_roof.cache_clear()


def test_gpu_streams_hold_four_last_level_caches(monkeypatch):
    def properties(l2_bytes):
        return lambda device: SimpleNamespace(L2_cache_size=l2_bytes)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties(50 << 20))  # H100
    assert roofs.stream_bytes("cuda") == roofs.GPU_STREAM_MIN >= 4 * 256e6  # MI300X's MALL
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties(512 << 20))
    assert roofs.stream_bytes("cuda") == 4 * (512 << 20)
    assert roofs.stream_bytes("cpu") >= min(4 * roofs.last_level_cache_bytes(), roofs.CPU_STREAM_CAP)


def test_a_gpu_gemm_is_sized_by_time_up_to_16384_on_random_operands(monkeypatch):
    sizes = []

    def fake_square(n, dtype, device, seed=0):  # a meta tensor: shapes, no GPU
        sizes.append(n)
        return torch.empty(n, n, device="meta", dtype=dtype)

    def h100_bf16(fn, calls, sync):  # 800 TFLOP/s at the latest size
        return 2 * sizes[-1] ** 3 / 8e14

    monkeypatch.setattr(roofs, "random_square", fake_square)
    monkeypatch.setattr(roofs.timing, "seconds_per_call", h100_bf16)
    rate, n = roofs.gemm_rate(torch.bfloat16, "meta")
    assert n == 16384 and rate == pytest.approx(8e14)  # 8192 takes 1.4 ms: under CALL_S
    monkeypatch.undo()
    a = roofs.random_square(64, torch.float32, "cpu")
    assert 0.8 < a.std().item() < 1.2 and not torch.equal(a, roofs.random_square(64, torch.float32,
                                                                                 "cpu", seed=1))


def test_expected_by_rule_maps_the_advice_to_what_against_rule_takes():
    pick = Advice(torch.bfloat16, "16-bit weights", "native")
    assert roofs.expected_by_rule(pick, torch.bfloat16, "16-bit weights") == "faster"
    assert roofs.expected_by_rule(pick, torch.bfloat16, "autocast") is None
    assert roofs.expected_by_rule(pick, torch.float16) is None
    assert roofs.expected_by_rule(Advice(None, "measure", "?"), torch.bfloat16) is None
    assert roofs.expected_by_rule(Advice(torch.float32, "float32", "AVX2"), torch.float16) == "no gain"
    assert math.isclose(ROOFS.ridge("bfloat16"), 12.5)
