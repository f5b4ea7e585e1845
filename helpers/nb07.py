"""Notebook 07's scaffolding: the decision guide, per machine class and workload shape (§1), each
row naming the section or source that backs it; :func:`hardware_class` places this machine in it."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .device import cuda_native_bf16
from .speed import DtypeSpeed, speed_profile


@dataclass(frozen=True)
class Advice:
    """One row of the guide: batch-1 work (memory-bound) apart from batched work (compute-bound)."""

    hardware: str
    decoding: str  # batch 1 / token by token: the weights' bytes decide
    batched: str  # batched inference: 16-bit units decide
    training: str
    backed_by: str


_DECODE = "16-bit weights (`.bfloat16()`): half the bytes; they tie or win even where the math is emulated"
GUIDE: dict[str, Advice] = {
    "cpu-avx2": Advice(
        "CPU whose bf16 matmuls measure slow: x86 with AVX2 only (most laptops, AMD before Zen 4)",
        _DECODE + ", below the crossover batch that 00 §2 measures",
        "float32: above the crossover batch (00 §2), 16-bit math is emulated and compute-bound layers "
        "are many times slower",
        "float32 (bf16 autocast runs; its compute-bound layers are slower)",
        "00 §1–2 (measured on your machine); 01 §4; 06 §7"),
    "cpu-bf16": Advice(
        "CPU whose bf16 matmuls measure fast (AVX512-BF16 or AMX: Xeon from Cooper Lake, AMD Zen 4 on)",
        _DECODE, "autocast bfloat16 or `.bfloat16()`, `eval()` + `inference_mode()`, channels_last",
        "autocast bfloat16 (CPU default), no GradScaler", "00 §1–2 (measured); 01 §3–4; 03 §4; 06 §6–7"),
    "mps": Advice(
        "Apple silicon GPU (MPS)", "float16 weights (`.half()`); measure, as on any new device",
        "float16 (autocast 'mps' where this torch has it); measure",
        "float32, or autocast float16 + GradScaler where this torch has MPS autocast; measure",
        "not run by this course: `helpers.supported_autocast_dtypes('mps')` asks your torch; PyTorch AMP "
        "docs (pytorch.org/docs/stable/amp.html)"),
    "cuda-fp32": Advice(
        "NVIDIA GPU without tensor cores (before Volta: P100, GTX 10xx, sm_60/61)",
        "float16 weights halve memory; speed: measure", "float32 (no fp16 tensor cores)", "float32",
        "NVIDIA Pascal specifications (GTX 10xx: fp16 at 1/64 of the fp32 rate); `helpers.fast_dtypes`"),
    "cuda-fp16": Advice(
        "NVIDIA GPU with fp16 tensor cores, none for bf16: V100 (sm_70), T4 (sm_75), RTX 20xx",
        "float16 weights", "float16 (`.half()` or autocast float16); bf16 runs without tensor cores there",
        "autocast float16 + GradScaler; float32 master weights",
        "03 §2; 04 §1–4, §7; data/gpu_peaks.json (V100, T4 datasheets); PyTorch AMP recipe; NVIDIA "
        "DeepLearningExamples ResNet-50 (V100 AMP 3.3x fp32)"),
    "cuda-bf16": Advice(
        "NVIDIA GPU from Ampere on: A100, A10, L4, RTX 30xx/40xx (sm_80/86/89), H100/H200 (sm_90)",
        "bfloat16 or float16 weights", "bfloat16 or float16; decide TF32 for what stays float32",
        "autocast bfloat16, no GradScaler; TF32 for float32 layers if accuracy allows; fp8 needs libraries",
        "00 §9–10 (TF32, fp8); 03 §4; 04 §7; data/gpu_peaks.json (A100/H100/H200 datasheets); NVIDIA "
        "DeepLearningExamples ResNet-50 (A100 AMP 2.6x TF32)"),
}


def hardware_class(device: str | torch.device, profile: dict[str, DtypeSpeed] | None = None) -> str:
    """The :data:`GUIDE` key for ``device``: on a CPU from the measured bf16 matmul speed
    (``profile``, default :func:`helpers.speed_profile`), on CUDA from the compute capability."""
    device = torch.device(device)
    if device.type == "cuda":
        if cuda_native_bf16(device):
            return "cuda-bf16"
        return "cuda-fp16" if torch.cuda.get_device_capability(device)[0] >= 7 else "cuda-fp32"
    if device.type == "mps":
        return "mps"
    if device.type != "cpu":
        raise ValueError(f"The guide covers cpu, cuda and mps, not {device.type!r}.")
    profile = profile if profile is not None else speed_profile(device)
    return "cpu-bf16" if profile["bfloat16"].compute_is_fast else "cpu-avx2"


def guide_markdown(highlight: str | None = None) -> str:
    """The guide as a markdown table; the row ``highlight`` (a :data:`GUIDE` key) is marked."""
    rows = ["| Hardware | Batch 1 / decoding (memory-bound) | Batched inference (compute-bound) | Training |"
            " Shown in / source |", "|---|---|---|---|---|"]
    for key, a in GUIDE.items():
        mark = " **← this machine**" if key == highlight else ""
        rows.append(f"| {a.hardware}{mark} | {a.decoding} | {a.batched} | {a.training} | {a.backed_by} |")
    return "\n".join(rows)
