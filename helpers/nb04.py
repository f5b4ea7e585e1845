"""Notebook 04's scaffolding: real gradients vs float16's range, the *faint task*'s data, network and
loss (underflows). The training steps themselves (``faint_step``, ``train_steps``) are typed in 04's cells."""

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from .device import strict_fp32
from .state import optimizer_snapshot, same_state, snapshot

FAINT_FACTOR = 4e-5  # the target is FAINT_FACTOR * input
FAINT_LR = 3e-6      # Adam's learning rate, matched to the size of the faint target
CLIP_NORM = 1e-4     # max_norm of the clipping experiments (well below the true gradient norm)
GRADIENT_MODULES = (nn.Conv2d, nn.BatchNorm2d, nn.ReLU, nn.MaxPool2d, nn.Linear)
Device = str | torch.device


def capture_gradients(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, *,
                      amp_dtype: torch.dtype | None = None, loss_scale: float = 1.0
                      ) -> dict[str, torch.Tensor]:
    """Gradients of each :data:`GRADIENT_MODULES` output and parameter (loss x ``loss_scale``)."""
    caught: list[torch.Tensor] = []

    def keep_output_grad(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        output.register_hook(lambda grad: caught.append(grad.detach().flatten().float().cpu()))

    hooks = [m.register_forward_hook(keep_output_grad)
             for m in model.modules() if isinstance(m, GRADIENT_MODULES)]
    try:
        model.zero_grad(set_to_none=True)
        with strict_fp32(), torch.amp.autocast(inputs.device.type, dtype=amp_dtype or torch.float32,
                                               enabled=amp_dtype is not None):
            loss = F.cross_entropy(model(inputs), labels)
        (loss * loss_scale).backward()
    finally:
        for hook in hooks:
            hook.remove()
    grads = [p.grad.flatten().float().cpu() for p in model.parameters() if p.grad is not None]
    return {"activation": torch.cat(caught), "parameter": torch.cat(grads)}


class Fractions(NamedTuple):
    """Shares of non-zero values stored in a 16-bit dtype that round to 0, are subnormal, or inf."""

    zero: float
    below_normal: float
    inf: float


def fractions(values: torch.Tensor, dtype: torch.dtype = torch.float16, scale: float = 1.0
              ) -> Fractions:
    """:class:`Fractions` of the non-zero ``values`` once ``values * scale`` is stored as dtype."""
    if not dtype.is_floating_point:
        raise TypeError(f"{dtype} is not a floating-point dtype")
    if not scale > 0:
        raise ValueError(f"scale must be positive, not {scale}")
    exact = values.detach().double()[values.detach() != 0]  # flat
    if exact.numel() == 0:
        raise ValueError("values has no non-zero entry: nothing to measure")
    stored = (exact * scale).to(dtype).abs()
    return Fractions(*((mask.double().mean().item()) for mask in
                       (stored == 0, stored < torch.finfo(dtype).smallest_normal, stored.isinf())))


def underflow_table(grads: dict[str, torch.Tensor], scales: tuple[float, ...] = (1.0, 2.0**16),
                    dtype: torch.dtype = torch.float16) -> str:
    """:func:`fractions` of each kind of gradient at each loss scale, as aligned text."""
    width = max(len(name) for name in grads)
    lines = [f"{'gradients':<{width}} {'scale':>5} {'zero':>9} {'below normal':>13} {'inf':>8}"]
    for name, values in grads.items():
        for scale in scales:
            zero, below, inf = fractions(values, dtype, scale)
            exponent = f"2^{round(torch.tensor(scale).log2().item())}"
            lines.append(f"{name:<{width}} {exponent:>5} {zero:>9.4%} {below:>13.4%} {inf:>8.4%}")
    return "\n".join(lines)


def plot_gradient_magnitudes(grads: dict[str, torch.Tensor], dtype: torch.dtype = torch.float16,
                             loss_scale: float = 2.0**16) -> None:
    """Histograms of log2 |gradient| per kind against ``dtype``'s range and ``loss_scale``."""
    import matplotlib.pyplot as plt
    info, name = torch.finfo(dtype), str(dtype).removeprefix("torch.")
    log2 = lambda value: torch.tensor(value).log2().item()  # noqa: E731
    to_zero = log2(info.smallest_normal * info.eps / 2)  # half the smallest subnormal
    _, ax = plt.subplots(figsize=(6, 3.5), dpi=80)
    edges = torch.linspace(-50, 10, 121)
    for kind, values in grads.items():
        magnitudes = values[values != 0].abs().float().log2().clamp(-50, 10)
        counts = torch.histc(magnitudes, bins=120, min=-50, max=10)
        ax.stairs((counts / counts.sum() / (edges[1] - edges[0])).numpy(), edges.numpy(), fill=True,
                  alpha=0.5, label=f"{kind} gradients")
    ax.axvspan(-50, to_zero, color="red", alpha=0.12, label=f"{name}: rounds to 0")
    ax.axvspan(to_zero, log2(info.smallest_normal), color="orange", alpha=0.12,
               label=f"{name}: subnormal (few bits)")
    ax.axvline(log2(info.max), color="red", lw=1, label=f"{name}: overflow ({info.max:g})")
    ax.axvline(to_zero - log2(loss_scale), color="black", ls=":", lw=1,
               label=f"zero limit with loss scale 2^{log2(loss_scale):.0f}")
    ax.set(xlabel="log2 |gradient|", ylabel="density", title=f"Real gradients vs {name}")
    ax.legend(fontsize=8, loc="upper right")
    plt.show()


def faint_data(device: Device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """64 x 64 seeded standard normal inputs, and the target ``FAINT_FACTOR * inputs``."""
    inputs = torch.randn(64, 64, generator=torch.Generator().manual_seed(0)).to(device)
    return inputs, FAINT_FACTOR * inputs


def faint_net(device: Device = "cpu") -> nn.Sequential:
    """The faint task's float32 network, seeded; its last layer starts at zero (output 0)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    nn.init.zeros_(net[2].weight)
    nn.init.zeros_(net[2].bias)
    return net.to(device)


def faint_loss(net: nn.Module, amp_dtype: torch.dtype | None = torch.float16
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean squared error and output of ``net`` (autocast in ``amp_dtype``; None: float32)."""
    device = next(net.parameters()).device
    inputs, target = faint_data(device)
    with torch.amp.autocast(device.type, dtype=amp_dtype or torch.float32,
                            enabled=amp_dtype is not None):
        output = net(inputs)
        return F.mse_loss(output, target), output


def plot_lines(lines: dict[str, list[float]], ylabel: str, title: str, base: float = 10) -> None:
    """One line per entry against the step, log scale in ``base`` (2: a staircase)."""
    import matplotlib.pyplot as plt
    _, ax = plt.subplots(figsize=(6, 3.5), dpi=80)
    for name, values in lines.items():
        ax.plot(values, label=name, ls="--" if "GradScaler" in name else "-",
                drawstyle="steps-post" if base == 2 else "default")
    ax.set(xlabel="step", ylabel=ylabel, title=title)
    ax.set_yscale("log", base=base)
    ax.legend()
    plt.show()


def clipping_net(device: Device = "cpu") -> nn.Sequential:
    """:func:`faint_net` with a last layer of 0.01, so that every layer has a gradient."""
    net = faint_net(device)
    with torch.no_grad():
        net[2].weight.fill_(0.01)
    return net


def update_norm(step_fn: Callable[..., None], max_norm: float = CLIP_NORM,
                device: Device = "cpu") -> float:
    """The norm of the SGD update (lr 1) ``step_fn(model, optimizer, scaler, loss, max_norm)`` makes
    from a float16-autocast loss, scaler at 2^16: ``max_norm`` when clipped right."""
    net = clipping_net(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=1.0)
    scaler = torch.amp.GradScaler(torch.device(device).type, init_scale=2.0**16)
    before = nn.utils.parameters_to_vector(net.parameters()).detach().clone()
    step_fn(net, optimizer, scaler, faint_loss(net)[0], max_norm)
    return (before - nn.utils.parameters_to_vector(net.parameters()).detach()).norm().item()


class TrainingState(NamedTuple):
    """Everything a float16 training run carries from step to step."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler


def fresh_state(device: Device = "cpu", growth_interval: int = 3) -> TrainingState:
    """A new faint-task run: network, Adam, ``StepLR``, a scaler (short growth interval)."""
    net = faint_net(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=FAINT_LR)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)
    scaler = torch.amp.GradScaler(torch.device(device).type, growth_interval=growth_interval)
    return TrainingState(net, optimizer, scheduler, scaler)


def same_run(a: TrainingState, b: TrainingState) -> bool:
    """Bit-for-bit the same weights and optimizer state (Adam's step count and moments)."""
    return (same_state(snapshot(a.model), snapshot(b.model))
            and same_state(optimizer_snapshot(a.optimizer), optimizer_snapshot(b.optimizer)))
