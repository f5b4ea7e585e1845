"""Solutions to notebook 00's exercises, computed with PyTorch."""
import torch

from ..formats import format_facts, spacing
from ..nb00 import logged_losses


def _bf16_running_sum_of_ones() -> float:
    total = torch.zeros((), dtype=torch.bfloat16)
    for _ in range(1000):
        total = total + 1
    return total.item()


def _mean_of_logged_losses() -> float:
    # the mean of the float16 values, computed exactly enough: float64 accumulator
    return logged_losses().double().mean().item()


SOLUTIONS = {
    # 00.1: where does a running bfloat16 sum of ones stop growing?
    "00.1": _bf16_running_sum_of_ones,
    # 00.2: the gap between consecutive float16 numbers between 1024 and 2048
    "00.2": lambda: spacing(1500.0, torch.float16).item(),
    # 00.3: the smallest positive float16 number
    "00.3": lambda: format_facts(torch.float16).smallest_subnormal,
    # 00.4 (fix the code): the mean of 10,000 float16 losses, which a float16 running sum gets wrong
    "00.4": _mean_of_logged_losses,
}

# 00.3 is printed rounded to three digits (5.96e-08): accept that.
# 00.4: a fix may keep a float16 result (torch.sum, then a division): two roundings of at most
# 2**-11 each, so 2e-3 accepts every correct fix; the broken float16 running sum is off by half.
TOLERANCES = {"00.3": 1e-3, "00.4": 2e-3}
