"""Notebook 07's scaffolding: :func:`hardware_class`, this machine's row of the guide (§1)."""
from __future__ import annotations

import torch

from .device import cuda_native_bf16, tensor_cores
from .speed import DtypeSpeed, speed_profile

CLASSES = ("cpu-avx2", "cpu-bf16", "mps", "cuda-fp32", "cuda-fp16", "cuda-bf16")


def hardware_class(device: str | torch.device, profile: dict[str, DtypeSpeed] | None = None) -> str:
    """The guide's row: CPU from the measured bf16 matmul speed, CUDA from the capability."""
    device = torch.device(device)
    if device.type == "cuda":
        if cuda_native_bf16(device):
            return "cuda-bf16"
        return "cuda-fp16" if tensor_cores(device) else "cuda-fp32"
    if device.type == "mps":
        return "mps"
    if device.type != "cpu":
        raise ValueError(f"The guide covers cpu, cuda and mps, not {device.type!r}.")
    profile = profile if profile is not None else speed_profile(device)
    return "cpu-bf16" if profile["bfloat16"].compute_is_fast else "cpu-avx2"
