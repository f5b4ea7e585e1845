"""The datasheet peaks file (data/gpu_peaks.json) and its reader (helpers.peaks)."""
from __future__ import annotations

import json
import re

import pytest

from helpers import peaks

PEAKS = peaks.load_peaks()
REQUIRED = ("V100 SXM2", "T4", "A10", "A100 SXM4 80GB", "L4", "L40S", "H100 SXM", "H200", "GeForce RTX 4090",
            "B200")
BLOCK_SCALED = ("mxfp8", "mxfp6", "mxfp4", "nvfp4")


def test_the_file_parses_and_lists_the_gpus_learners_meet():
    raw = json.loads(peaks.PEAKS_FILE.read_text())
    assert len(raw["gpus"]) == len(PEAKS)  # no duplicate names
    assert set(REQUIRED) <= set(PEAKS)
    for gpu in PEAKS.values():
        assert set(gpu.tflops) == set(peaks.FORMATS), gpu.name
        assert re.fullmatch(r"\d+\.\d", gpu.capability), gpu.name
        assert gpu.memory_gb > 0 and 0 < gpu.bandwidth_tb_s < 10, gpu.name
        assert gpu.match, f"{gpu.name}: no name pattern"


def test_every_gpu_names_an_nvidia_source_document():
    for gpu in PEAKS.values():
        assert re.search(r"(datasheet|whitepaper)", gpu.source, flags=re.I), gpu.name
        assert re.search(r"https://[\w.-]*nvidia\.com/\S+", gpu.source), gpu.name


@pytest.mark.parametrize("name", sorted(PEAKS))
def test_dense_figures_are_consistent(name):
    gpu = PEAKS[name]
    t, major_minor = gpu.tflops, tuple(int(p) for p in gpu.capability.split("."))
    assert t["fp32"] and t["fp16"], "every GPU listed has fp32 and fp16 tensor-core figures"
    for key in ("tf32", "fp16", "bf16", "fp8"):
        assert t[key] is None or t[key] >= t["fp32"], f"{key} below fp32"
    assert (t["tf32"] is not None) == (t["bf16"] is not None) == (major_minor >= (8, 0))  # Ampere adds both
    assert (t["fp8"] is not None) == (major_minor >= (8, 9))  # Ada and Hopper add fp8
    if t["bf16"] is not None:
        assert t["bf16"] == t["fp16"]  # same tensor-core rate with fp32 accumulate
        # TF32: half the 16-bit rate; fp8 twice it. The L40S datasheet rounds inconsistently (TF32 183 and
        # FP8 733 beside BF16 362.05): allow 2 %.
        assert t["tf32"] <= t["bf16"] / 2 * 1.02
    if t["fp8"] is not None:
        assert t["fp8"] == pytest.approx(2 * t["fp16"], rel=0.02)


def test_block_scaled_rates_from_blackwell_on():
    """MX and NVFP4 block-scaled tensor-core rates exist from capability 10.0 (Blackwell); MXFP8 and MXFP6 run
    at the fp8 rate, the fp4 formats at twice it."""
    for gpu in PEAKS.values():
        blackwell = tuple(int(p) for p in gpu.capability.split(".")) >= (10, 0)
        assert bool(gpu.block_scaled_tflops) == blackwell, gpu.name
        if blackwell:
            rates = gpu.block_scaled_tflops
            assert set(rates) == set(BLOCK_SCALED), gpu.name
            assert rates["mxfp8"] == rates["mxfp6"] == gpu.tflops["fp8"]
            assert rates["mxfp4"] == rates["nvfp4"] == 2 * gpu.tflops["fp8"]


def test_b200_figures_are_the_datasheets_sparse_ones_halved():
    b200 = PEAKS["B200"]
    assert b200.tflops["bf16"] == 4500 / 2 and b200.tflops["fp8"] == 9000 / 2
    assert b200.block_scaled_tflops["nvfp4"] == 18000 / 2 and b200.tflops["fp32"] == 75.0
    assert b200.capability == "10.0"


def test_sparse_figures_were_halved_for_hopper():
    # The H100/H200 datasheets print 1,979 TFLOP/s bf16 "with sparsity": the dense figure is half of it.
    for name in ("H100 SXM", "H200"):
        assert PEAKS[name].tflops["bf16"] == pytest.approx(1979 / 2)
        assert PEAKS[name].tflops["fp32"] == 67.0


@pytest.mark.parametrize("device_name, expected", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100", "H100 SXM"), ("NVIDIA H100 PCIe", None),
    ("NVIDIA H100 NVL", None), ("NVIDIA H200", "H200"), ("NVIDIA GH200 480GB", None),
    ("Tesla T4", "T4"), ("NVIDIA T400", None), ("Tesla V100-SXM2-32GB", "V100 SXM2"),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM4 80GB"), ("NVIDIA A100-SXM4-40GB", "A100 SXM4 80GB"),
    ("NVIDIA A10", "A10"), ("NVIDIA A10G", None), ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"),
    ("NVIDIA L40", None), ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090"),
    ("NVIDIA GeForce RTX 4090 Laptop GPU", None), ("NVIDIA GeForce RTX 3090", None), ("cpu", None),
    ("NVIDIA B200", "B200"), ("NVIDIA GB200", None),
])
def test_peak_for_matches_torch_device_names(device_name, expected):
    found = peaks.peak_for(device_name)
    assert (found.name if found else None) == expected


def test_fraction_of_peak():
    assert peaks.fraction_of_peak(791.6, "NVIDIA H100 80GB HBM3", "bfloat16") == pytest.approx(0.8)
    assert peaks.fraction_of_peak(33.5, "NVIDIA H100 80GB HBM3", "fp32") == pytest.approx(0.5)
    assert peaks.fraction_of_peak(10.0, "Tesla T4", "bf16") is None  # no bf16 tensor cores on Turing
    assert peaks.fraction_of_peak(10.0, "Tesla T4", "tf32") is None
    assert peaks.fraction_of_peak(10.0, "Some Unknown GPU", "fp16") is None
    with pytest.raises(ValueError, match="Unknown format"):
        peaks.fraction_of_peak(1.0, "Tesla T4", "int8")


def test_peak_tflops_reads_every_name_of_a_format():
    h100 = PEAKS["H100 SXM"].tflops
    name = "NVIDIA H100 80GB HBM3"
    for alias, key in (("float32", "fp32"), ("torch.bfloat16", "bf16"), ("half", "fp16"), ("tf32", "tf32")):
        assert peaks.peak_tflops(name, alias) == h100[key], alias
    assert peaks.peak_tflops("Tesla T4", "bfloat16") is None and peaks.peak_tflops("cpu", "fp32") is None
    assert peaks.fraction_of_peak(None, name, "bf16") is None  # a dtype absent on the device: no figure
    with pytest.raises(ValueError, match="Unknown format"):
        peaks.peak_tflops(name, "int8")


def test_good_gemm_fraction_is_cited_and_plausible():
    assert 0.7 <= peaks.GOOD_GEMM_FRACTION <= 0.9
    # The cited H100 measurement, as a fraction of the file's own H100 peak, is about the stated fraction.
    assert peaks.fraction_of_peak(794.5, "NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(
        peaks.GOOD_GEMM_FRACTION, abs=0.02)
    assert "Maximum Achievable Matmul FLOPS" in peaks.GOOD_GEMM_SOURCE and "https://" in peaks.GOOD_GEMM_SOURCE


def test_ridge_is_datasheet_peak_over_bandwidth():
    h100, v100 = "NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-32GB"
    assert peaks.ridge_flop_per_byte(h100, "bfloat16") == pytest.approx(989.5 / 3.35)  # ~295
    assert round(peaks.ridge_flop_per_byte("NVIDIA A100-SXM4-80GB", "bf16")) == 153
    assert round(peaks.ridge_flop_per_byte(v100, "float16")) == 139
    assert peaks.ridge_flop_per_byte(v100, "bfloat16") is None  # no bf16 tensor cores
    assert peaks.ridge_flop_per_byte("cpu", "fp32") is None
