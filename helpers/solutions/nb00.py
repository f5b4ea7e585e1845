"""Solutions to notebook 00's exercises, computed with PyTorch."""
import torch

from ..formats import format_facts, spacing


def _bf16_running_sum_of_ones() -> float:
    total = torch.zeros((), dtype=torch.bfloat16)
    for _ in range(1000):
        total = total + 1
    return total.item()


SOLUTIONS = {
    # 00.1: where does a running bfloat16 sum of ones stop growing?
    "00.1": _bf16_running_sum_of_ones,
    # 00.2: the gap between consecutive float16 numbers between 1024 and 2048
    "00.2": lambda: spacing(1500.0, torch.float16).item(),
    # 00.3: the smallest positive float16 number
    "00.3": lambda: format_facts(torch.float16).smallest_subnormal,
}

# 00.3 is printed rounded to three digits (5.96e-08): accept that.
TOLERANCES = {"00.3": 1e-3}
