"""Solutions to notebook 02 (dtype-following tensors), computed with PyTorch."""
from __future__ import annotations

import torch
from torch import nn


def bfloat16_plus_float16_dtype() -> torch.dtype:
    """02.1: the dtype of bfloat16 + float16 tensors (neither holds all values of the other)."""
    return (torch.ones(3, dtype=torch.bfloat16) + torch.ones(3, dtype=torch.float16)).dtype


def smallest_float32_that_overflows_fp16() -> float:
    """02.2: the smallest float32 value that becomes inf when converted to float16."""
    finite_max = torch.tensor(torch.finfo(torch.float16).max, dtype=torch.float32)
    steps = torch.arange(0, 2**14, dtype=torch.float64) * 2.0**-8  # float32 steps near 65504
    candidates = steps + float(finite_max)
    candidates = candidates.to(torch.float32)
    overflow = candidates.to(torch.float16).isinf()
    return float(candidates[overflow][0])


def wrong_positions_in_fp16_arange() -> int:
    """02.3: how many entries of torch.arange(4096, dtype=torch.float16) differ from their index."""
    table = torch.arange(4096, dtype=torch.float16)
    return int((table.double() != torch.arange(4096).double()).sum())  # compared in float64


class AttentionPool(nn.Module):
    """02.4, repaired: padding replaced by the dtype's smallest finite value, never multiplied."""

    def __init__(self, dim: int = 8):
        super().__init__()
        self.score = nn.Linear(dim, 1)
        self.register_buffer("big_negative", torch.tensor(-1e9))  # kept: the weights load the same

    def forward(self, features: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        scores = self.score(features).squeeze(-1)
        scores = scores.masked_fill(pad, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1)
        return (weights.unsqueeze(-1) * features).sum(dim=1)


def repaired_pool_mean() -> float:
    """02.4: the mean of the repaired float16 AttentionPool's output on the notebook's inputs."""
    with torch.random.fork_rng(devices=[]):  # leave the caller's global generator alone
        torch.manual_seed(0)
        pool = AttentionPool().half()
    features = torch.rand(2, 5, 8, generator=torch.Generator().manual_seed(2)).half()
    padding = torch.tensor([[False] * 5, [False, False, False, True, True]])
    with torch.inference_mode():
        output = pool(features, padding)
    assert output.dtype == torch.float16 and not output.isnan().any()
    return output.float().mean().item()


SOLUTIONS = {
    "02.1": bfloat16_plus_float16_dtype,
    "02.2": smallest_float32_that_overflows_fp16,
    "02.3": wrong_positions_in_fp16_arange,
    "02.4": repaired_pool_mean,
}

# 02.2 is about precision: 65519.996 is not the answer (it converts to the finite 65504): exact.
# 02.4: a correct repair may round the float16 softmax or weighted sum differently (a float32
# softmax island, say): two float16 ulps, relative, of the mean of the 16 pooled float16 numbers.
TOLERANCES = {"02.2": 0.0, "02.4": 2 * torch.finfo(torch.float16).eps}
