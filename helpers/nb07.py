"""Notebook 07's scaffolding: :func:`hardware_class`, this machine's row of the guide (§1)."""
import platform

import torch

from .device import cuda_native_bf16, tensor_cores
from .speed import speed_profile

CLASSES = ("cpu-avx2", "cpu-bf16", "cpu-arm", "mps", "cuda-fp32", "cuda-fp16", "cuda-bf16")


def hardware_class(device: str | torch.device, profile: dict | None = None) -> str:
    """The guide's row: CUDA by capability, Arm CPUs by architecture, x86 by the measured matmul."""
    device = torch.device(device)
    if device.type == "cuda":
        return "cuda-bf16" if cuda_native_bf16(device) else \
            "cuda-fp16" if tensor_cores(device) else "cuda-fp32"
    if device.type not in ("cpu", "mps"):
        raise ValueError(f"The guide covers cpu, cuda and mps, not {device.type!r}.")
    if device.type == "mps" or platform.machine().lower() in ("arm64", "aarch64"):
        return "mps" if device.type == "mps" else "cpu-arm"
    profile = profile if profile is not None else speed_profile(device)
    return "cpu-bf16" if profile["bfloat16"].compute_is_fast else "cpu-avx2"
