"""The course's decision guide: from the learner's hardware to what to use for inference and training (notebook 07).

Every recommendation names what backs it: a section of this course (where a cell shows it) or a cited source.
:func:`hardware_class` places the machine running the notebook in the table from *measurement* on a CPU
(:func:`helpers.speed.speed_profile`) and from the compute capability on an NVIDIA GPU (tensor cores from
sm_70, bf16 ones from sm_80).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .device import cuda_native_bf16
from .speed import DtypeSpeed, speed_profile


@dataclass(frozen=True)
class Advice:
    """One row of the decision guide."""

    hardware: str
    inference: str
    training: str
    backed_by: str


GUIDE: dict[str, Advice] = {
    "cpu-avx2": Advice(
        "CPU whose bf16 matmuls measure slow: most laptops and desktops (x86 with AVX2 only: Intel Core, AMD "
        "before Zen 4)",
        "float32. bf16/fp16 matmuls are emulated (~100x slower), whole CNNs several times slower; 16 bits only "
        "pays for memory-bound work and storage",
        "float32 (bf16 autocast runs, but slower)",
        "00 §1–2 (measured on your machine); 01 §4; 06 §7"),
    "cpu-bf16": Advice(
        "CPU whose bf16 matmuls measure fast (x86 with AVX512-BF16 or AMX: Intel Xeon from Cooper Lake/Sapphire "
        "Rapids, AMD Zen 4 and later)",
        "autocast bfloat16 or `.bfloat16()`, `eval()` + `inference_mode()`, channels_last for CNNs",
        "autocast bfloat16 (CPU default), no GradScaler",
        "00 §1–2 (measured); 01 §3–4; 03 §4; 06 §6–7"),
    "mps": Advice(
        "Apple silicon GPU (MPS)",
        "float16 (`.half()`, or autocast 'mps' where this torch has it); measure, as on any new device",
        "float32, or autocast float16 + GradScaler where this torch supports MPS autocast; measure",
        "not run by this course: `helpers.device.supported_autocast_dtypes('mps')` asks your torch; PyTorch docs, "
        "'Automatic Mixed Precision package - torch.amp' (pytorch.org/docs/stable/amp.html)"),
    "cuda-fp32": Advice(
        "NVIDIA GPU without tensor cores (before Volta: P100, GTX 10xx, sm_60/61)",
        "float32 (float16 arithmetic is slow or no faster; it still halves memory)",
        "float32",
        "NVIDIA Pascal specifications (GTX 10xx: fp16 at 1/64 of the fp32 rate); `helpers.device.fast_dtypes`"),
    "cuda-fp16": Advice(
        "NVIDIA GPU with fp16 tensor cores but none for bf16: V100 (sm_70), T4 (sm_75), RTX 20xx",
        "float16 (`.half()` or autocast float16); bf16 runs emulated there, slower",
        "autocast float16 + GradScaler; float32 master weights",
        "03 §2; 04 §1–4, §7; data/gpu_peaks.json (NVIDIA V100 and T4 datasheets); PyTorch AMP recipe "
        "(pytorch.org/tutorials/recipes/recipes/amp_recipe.html); NVIDIA DeepLearningExamples ResNet-50 (V100 AMP "
        "3.3x fp32)"),
    "cuda-bf16": Advice(
        "NVIDIA GPU from Ampere on: A100, A10, L4, L40S, RTX 30xx/40xx (sm_80/86/89), H100/H200 (sm_90), Blackwell",
        "bfloat16 or float16; decide TF32 for what stays float32 (cuDNN convolutions default to TF32)",
        "autocast bfloat16, no GradScaler; TF32 for float32 layers if the accuracy allows; fp8 (Ada, Hopper, "
        "Blackwell) needs extra libraries (beyond this course)",
        "00 §9–10 (TF32, fp8); 03 §4; 04 §7; data/gpu_peaks.json (NVIDIA A100/H100/H200 datasheets); NVIDIA "
        "DeepLearningExamples ResNet-50 (A100 AMP 2.6x TF32)"),
}


def hardware_class(device: str | torch.device,
                   profile: dict[str, DtypeSpeed] | None = None) -> str:
    """The :data:`GUIDE` key for ``device``: on a CPU from the measured bf16 matmul speed (``profile``, default
    :func:`speed_profile`), on CUDA from native bf16 support (compute capability 8.0 and later)."""
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
    """The guide as a markdown table; the row ``highlight`` (a :data:`GUIDE` key) is marked "← this machine"."""
    rows = ["| Hardware | Inference | Training | Shown in / source |", "|---|---|---|---|"]
    for key, advice in GUIDE.items():
        mark = " **← this machine**" if key == highlight else ""
        rows.append(f"| {advice.hardware}{mark} | {advice.inference} | {advice.training} | {advice.backed_by} |")
    return "\n".join(rows)
