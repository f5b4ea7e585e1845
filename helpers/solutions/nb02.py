"""Solutions to notebook 02 (dtype-following tensors), computed with PyTorch."""
from __future__ import annotations

import torch


def bfloat16_plus_float16_dtype() -> torch.dtype:
    """02.1: the dtype of a bfloat16 tensor plus a float16 tensor (neither holds all values of the other)."""
    return (torch.ones(3, dtype=torch.bfloat16) + torch.ones(3, dtype=torch.float16)).dtype


def smallest_float32_that_overflows_fp16() -> float:
    """02.2: the smallest float32 value that becomes inf when converted to float16."""
    finite_max = torch.tensor(torch.finfo(torch.float16).max, dtype=torch.float32)
    candidates = torch.arange(0, 2**14, dtype=torch.float64) * 2.0**-8 + float(finite_max)  # float32 steps here
    candidates = candidates.to(torch.float32)
    overflow = candidates.to(torch.float16).isinf()
    return float(candidates[overflow][0])


def wrong_positions_in_fp16_arange() -> int:
    """02.3: how many entries of torch.arange(4096, dtype=torch.float16) differ from their index."""
    return int((torch.arange(4096, dtype=torch.float16).double() != torch.arange(4096).double()).sum())


SOLUTIONS = {
    "02.1": bfloat16_plus_float16_dtype,
    "02.2": smallest_float32_that_overflows_fp16,
    "02.3": wrong_positions_in_fp16_arange,
}

# 02.2 is about precision: 65519.996 is not the answer (it converts to the finite 65504), so match exactly.
TOLERANCES = {"02.2": 0.0}
