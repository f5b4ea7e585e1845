"""helpers.nb00: the setup check's recommendation (fake profiles) and the two-kinds-of-speed reading."""
import torch

from helpers.speed import DtypeSpeed, speed_verdict
from helpers.nb00 import (Recommendation, SpeedPoint, measure_two_kinds, recommendation, speedups,
                           two_kinds_finding, verdict_table)


def _profile(bf16: tuple[float, float], fp16: tuple[float, float]) -> dict[str, DtypeSpeed]:
    return {"float32": DtypeSpeed("float32", 1.0, 1.0, "the baseline"),
            "bfloat16": DtypeSpeed("bfloat16", *bf16, speed_verdict(*bf16)),
            "float16": DtypeSpeed("float16", *fp16, speed_verdict(*fp16))}


AVX2_LAPTOP = _profile(bf16=(0.01, 1.7), fp16=(0.01, 1.6))
AVX512_BF16_CPU = _profile(bf16=(2.2, 1.7), fp16=(0.01, 1.6))
CUDA_AMPERE = _profile(bf16=(12.0, 1.9), fp16=(12.5, 1.9))
CUDA_T4 = _profile(bf16=(0.2, 1.9), fp16=(6.0, 1.9))


def test_avx2_laptop_keeps_float32():
    r = recommendation(AVX2_LAPTOP, "cpu")
    assert r.inference.startswith("float32") and r.training == "float32"
    assert "0.01x" in r.reason


def test_avx512_bf16_cpu_gets_bf16_autocast_without_scaler():
    r = recommendation(AVX512_BF16_CPU, "cpu")
    assert r.inference == "torch.amp.autocast('cpu', dtype=torch.bfloat16)"
    assert "no GradScaler" in r.training


def test_cuda_ampere_gets_bf16_and_t4_gets_fp16_with_scaler():
    assert "bfloat16" in recommendation(CUDA_AMPERE, "cuda").inference
    t4 = recommendation(CUDA_T4, "cuda")
    assert t4.inference == "torch.amp.autocast('cuda', dtype=torch.float16)"
    assert "GradScaler('cuda')" in t4.training
    assert isinstance(t4, Recommendation) and "training" in str(t4)


def test_verdict_table_puts_measurement_before_report():
    text = verdict_table(AVX2_LAPTOP, {"bfloat16": "CPU reports no avx512_bf16"})
    lines = text.splitlines()
    assert "measured: emulated" in lines[2] and "reported: CPU reports no avx512_bf16" in lines[3]


def _points(add: dict[str, float], mm: dict[str, float]) -> list[SpeedPoint]:
    points = [SpeedPoint("add", d, 1 << 24, 0.01 / r) for d, r in add.items()]
    points += [SpeedPoint("add", d, 1 << 12, 1e-6) for d in add]
    points += [SpeedPoint("matmul", d, 256, 0.001 / r) for d, r in mm.items()]
    points += [SpeedPoint("matmul", d, 512, 0.008) for d in ("float32", "bfloat16")]  # fp16 skipped (emulated)
    return points


def test_speedups_compare_at_the_largest_common_size():
    size, ratios = speedups(_points({"float32": 1, "bfloat16": 1.7, "float16": 1.6},
                                    {"float32": 1, "bfloat16": 2.0, "float16": 0.01}), "matmul")
    assert size == 256 and abs(ratios["bfloat16"] - 2.0) < 1e-9 and abs(ratios["float16"] - 0.01) < 1e-9


def test_finding_words_follow_the_numbers():
    laptop = two_kinds_finding(_points({"float32": 1, "bfloat16": 1.7, "float16": 1.6},
                                       {"float32": 1, "bfloat16": 0.01, "float16": 0.01}))
    assert "bfloat16 1.7x faster than float32" in laptop and "100x slower" in laptop
    assert laptop.endswith("Faster math (16-bit units) here for: none.")
    server = two_kinds_finding(_points({"float32": 1, "bfloat16": 1.7, "float16": 1.6},
                                       {"float32": 1, "bfloat16": 2.5, "float16": 0.01}))
    assert server.endswith("here for: bfloat16.")


def test_measure_two_kinds_runs_every_dtype_and_size():
    points = measure_two_kinds("cpu", add_sizes=(256, 1024), matmul_sizes=(8, 16), min_run_time=0.001)
    assert {p.dtype for p in points} == {"float32", "bfloat16", "float16"}
    assert {p.size for p in points if p.op == "add"} == {256, 1024}
    assert all(p.seconds > 0 and p.rate > 0 for p in points)
    assert torch.get_float32_matmul_precision() == "highest"


def test_measure_two_kinds_restores_the_thread_count():
    threads = torch.get_num_threads()
    measure_two_kinds("cpu", add_sizes=(64, 128), matmul_sizes=(4, 8), min_run_time=0.001, cpu_threads=1)
    assert torch.get_num_threads() == threads
