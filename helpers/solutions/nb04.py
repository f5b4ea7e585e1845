"""Solutions to notebook 04's exercises, computed with PyTorch."""
import torch
from torch import nn

from ..scaling import injected_inf_steps


def _scale_after_sequence() -> float:
    clean, bad = False, True
    steps = [clean, clean, clean, bad, clean, clean, clean, clean, bad, bad, clean]
    return injected_inf_steps(steps, init_scale=2.0**16, growth_interval=3)[-1]


def _smallest_scale_keeping_1e9() -> float:
    gradient = torch.tensor(1e-9, dtype=torch.float64)
    k = 0
    while (gradient * 2.0**k).to(torch.float16) == 0:
        k += 1
    return 2.0**k


def _steps_applied_with_accumulation() -> int:
    weight = nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    applied = 0
    for micro_batch in range(1, 13):
        scaler.scale(weight.sum() / 4).backward()
        if micro_batch == 6:
            weight.grad.fill_(float("inf"))
        if micro_batch % 4 == 0:
            before = weight.detach().clone()
            scaler.step(optimizer)
            scaler.update()
            applied += int(not torch.equal(before, weight.detach()))
            optimizer.zero_grad()
    return applied


SOLUTIONS = {
    # 04.1: scale after clean x3, inf, clean x4, inf, inf, clean with growth_interval=3 from 2**16
    "04.1": _scale_after_sequence,
    # 04.2: smallest power-of-two loss scale that keeps a 1e-9 gradient non-zero in float16
    "04.2": _smallest_scale_keeping_1e9,
    # 04.3: optimizer steps applied over 12 micro-batches, accumulation 4, inf in micro-batch 6
    "04.3": _steps_applied_with_accumulation,
}
