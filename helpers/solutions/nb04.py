"""Solutions to notebook 04's exercises, computed with PyTorch (fix-the-code: the repaired code)."""
import torch
from torch import nn

from .. import nb04 as lab


def injected_inf_steps(steps: list[bool], *, init_scale: float = 2.0**16,
                       growth_interval: int = 2000) -> list[float]:
    """The scale of a real ``GradScaler("cpu")`` after each ``update()``, for a sequence of steps
    (True: an inf gradient, injected into a single float32 weight)."""
    weight = nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([weight], lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    scales = []
    for bad in steps:
        optimizer.zero_grad()
        scaler.scale(weight.sum()).backward()
        if bad:
            weight.grad.fill_(float("inf"))
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales


def unscale_then_clip(model: nn.Module, optimizer: torch.optim.Optimizer,
                      scaler: torch.amp.GradScaler, loss: torch.Tensor, max_norm: float) -> None:
    """04.3 repaired: scale and backward, ``unscale_``, clip the true gradients, step, update."""
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()


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


def _clipped_update_norm() -> float:
    return lab.update_norm(unscale_then_clip, lab.CLIP_NORM)


def _resumed_scale() -> float:
    def save(model, optimizer, scaler):
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict()}

    def load(checkpoint, model, optimizer, scaler):
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scaler.load_state_dict(checkpoint["scaler"])

    return lab.resumed_scale(save, load)


def _fp16_training_ratio() -> float:
    net = lab.faint_net("cpu")  # float32 parameters: autocast computes in float16
    optimizer = torch.optim.Adam(net.parameters(), lr=lab.FAINT_LR)
    return lab.fp16_training_ratio(net, optimizer, torch.amp.GradScaler("cpu"))


SOLUTIONS = {
    # 04.1: scale after clean x3, inf, clean x4, inf, inf, clean with growth_interval=3 from 2**16
    "04.1": _scale_after_sequence,
    # 04.6: smallest power-of-two loss scale that keeps a 1e-9 gradient non-zero in float16
    "04.6": _smallest_scale_keeping_1e9,
    # 04.2: optimizer steps applied over 12 micro-batches, accumulation 4, inf in micro-batch 6
    "04.2": _steps_applied_with_accumulation,
    # 04.3 (fix the code): norm of the clipped SGD update, unscale_ before clipping (= max_norm)
    "04.3": _clipped_update_norm,
    # 04.4 (fix the code): the scale a run resumes with from a checkpoint with scaler.state_dict()
    "04.4": _resumed_scale,
    # 04.5 (fix the code): last / first loss of float16 autocast, float32 parameters and a scaler
    "04.5": _fp16_training_ratio,
}

# 04.3: the clipped update is max_norm up to float32 rounding on any device; 04.5: a GPU's float16
# kernels change the ratio by far less than 5 %, while a run without a working scaler ends at 2.7x
# the ratio (or NaN).
TOLERANCES = {"04.3": 1e-3, "04.5": 0.05}
