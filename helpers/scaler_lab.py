"""The experiments of notebook 04 (GradScaler), so that the notebook shows the recipe and not the scaffolding.

Two workloads:

- the trained reference CNN, for *real* gradients measured against the float16 range
  (:func:`capture_gradients`, :func:`underflow_table`, :func:`plot_gradient_magnitudes`);
- the **faint task**, a tiny two-layer network that learns a faint copy of its input (the target is the input
  times :data:`FAINT_FACTOR`, the loss a mean over 4096 outputs), so its gradients lie below float16's
  smallest subnormal number unless the loss is scaled (:func:`faint_data`, :func:`faint_net`,
  :func:`train_faint`). It is small enough to train in float16 on any CPU in a fraction of a second.

Every float16 run here uses ``torch.amp.autocast(device_type, dtype=torch.float16)`` with float32 parameters,
on the device given (CPU or CUDA); every float32 run is strict float32 (no TF32 on a GPU).
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from .device import strict_fp32
from .state import optimizer_snapshot, same_state, snapshot

FAINT_FEATURES = 64        # inputs and outputs per sample
FAINT_BATCH = 64           # samples: 64 x 64 = 4096 outputs in the mean squared error
FAINT_FACTOR = 4e-5        # the target is FAINT_FACTOR * input
FAINT_LR = 3e-6            # Adam's learning rate, matched to the size of the faint target
CLIP_NORM = 1e-4           # the max_norm of the clipping experiments (well below the true gradient norm)
GRADIENT_MODULES = (nn.Conv2d, nn.BatchNorm2d, nn.ReLU, nn.MaxPool2d, nn.Linear)

Device = str | torch.device


# --- real gradients of the reference model -------------------------------------------------------------------

def capture_gradients(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, *,
                      amp_dtype: torch.dtype | None = None, loss_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """One cross-entropy backward pass of ``model``; its gradients, flattened to float32 on the CPU.

    Returns ``{"activation": ..., "parameter": ...}``: the gradients flowing out of every Conv2d, BatchNorm2d,
    ReLU, MaxPool2d and Linear module (the ones the backward pass computes between layers, caught with tensor
    hooks, zeros included, in a fixed order), and every parameter's ``.grad``. ``amp_dtype=None`` runs in strict
    float32; otherwise the forward pass runs under autocast in that dtype. The loss is multiplied by
    ``loss_scale`` before ``backward()``, and the gradients are returned as computed (still multiplied by it).
    """
    caught: list[torch.Tensor] = []

    def keep_output_grad(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        output.register_hook(lambda grad: caught.append(grad.detach().flatten().float().cpu()))

    hooks = [m.register_forward_hook(keep_output_grad) for m in model.modules() if isinstance(m, GRADIENT_MODULES)]
    try:
        model.zero_grad(set_to_none=True)
        device_type = inputs.device.type
        with strict_fp32(), torch.amp.autocast(device_type, dtype=amp_dtype or torch.float32,
                                               enabled=amp_dtype is not None):
            loss = F.cross_entropy(model(inputs), labels)
        (loss * loss_scale).backward()
    finally:
        for hook in hooks:
            hook.remove()
    parameters = [p.grad.detach().flatten().float().cpu() for p in model.parameters() if p.grad is not None]
    return {"activation": torch.cat(caught), "parameter": torch.cat(parameters)}


@dataclass(frozen=True)
class Fractions:
    """What happens to non-zero gradients (times a loss scale) stored in a 16-bit dtype (fractions in [0, 1])."""

    zero: float          # round to exactly 0 (underflow)
    below_normal: float  # land below the smallest normal number (subnormal or 0): precision lost
    inf: float           # overflow to inf


def underflow_table(grads: dict[str, torch.Tensor], scales: tuple[float, ...] = (1.0, 2.0**8, 2.0**16, 2.0**24),
                    dtype: torch.dtype = torch.float16) -> dict[float, dict[str, Fractions]]:
    """For each loss scale and each kind of gradient: the :class:`Fractions` of its non-zero values that round to
    0, land below normal, or overflow when ``gradient * scale`` is *stored* in ``dtype``.

    This depends only on the values and the dtype's range (no kernel is involved), so it is the same on every
    machine for the same gradients. The same fractions as :func:`helpers.scaling.underflow_fraction` and its
    siblings, computed in one pass: float32 gradients times a power-of-two scale are exact in float32.
    """
    table: dict[float, dict[str, Fractions]] = {}
    for scale in scales:
        exact_in_float32 = torch.tensor(scale).log2().frac().item() == 0
        table[scale] = {}
        for name, values in grads.items():
            values = values[values != 0]
            if not (values.dtype == torch.float32 and exact_in_float32):
                values = values.double()
            stored = (values * scale).to(dtype).abs()
            table[scale][name] = Fractions((stored == 0).double().mean().item(),
                                           (stored < torch.finfo(dtype).smallest_normal).double().mean().item(),
                                           stored.isinf().double().mean().item())
    return table


def format_underflow_table(table: dict[float, dict[str, Fractions]]) -> str:
    """:func:`underflow_table` as aligned text: one row per loss scale, three columns per kind of gradient."""
    names = list(next(iter(table.values())))
    lines = ["loss scale | " + " | ".join(f"{name + ' gradients':^38}" for name in names),
             "           | " + " | ".join(f"{'zero':>10} {'below normal':>14} {'inf':>10} " for _ in names)]
    for scale, row in table.items():
        exponent = round(torch.tensor(scale).log2().item())
        cells = [f"{f.zero:>10.4%} {f.below_normal:>14.4%} {f.inf:>10.4%} " for f in row.values()]
        lines.append(f"{f'2^{exponent}':>10} | " + " | ".join(cells))
    return "\n".join(lines)


def plot_gradient_magnitudes(grads: dict[str, torch.Tensor], dtype: torch.dtype = torch.float16,
                             loss_scale: float = 2.0**16) -> None:
    """Histograms of log2 |gradient| for each kind in ``grads`` (zeros left out), against ``dtype``'s range:
    the band that rounds to 0, the subnormal band, the overflow line, and where the zero band ends once the loss
    is multiplied by ``loss_scale``."""
    import matplotlib.pyplot as plt

    info = torch.finfo(dtype)
    to_zero = torch.tensor(info.smallest_normal * info.eps / 2).log2().item()   # half the smallest subnormal
    normal = torch.tensor(info.smallest_normal).log2().item()
    shift = torch.tensor(loss_scale).log2().item()
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=80)
    edges = torch.linspace(-50, 10, 121)
    for name, values in grads.items():
        magnitudes = values[values != 0].abs().float().log2().clamp(-50, 10)
        counts = torch.histc(magnitudes, bins=len(edges) - 1, min=-50, max=10)
        density = counts / counts.sum() / (edges[1] - edges[0])
        ax.stairs(density.numpy(), edges.numpy(), fill=True, alpha=0.6, label=f"{name} gradients")
    name = str(dtype).removeprefix("torch.")
    ax.axvspan(-50, to_zero, color="red", alpha=0.12, label=f"{name}: rounds to 0")
    ax.axvspan(to_zero, normal, color="orange", alpha=0.12, label=f"{name}: subnormal (few bits)")
    ax.axvline(torch.tensor(info.max).log2().item(), color="red", lw=1, label=f"{name}: overflow ({info.max:g})")
    ax.axvline(to_zero - shift, color="black", ls=":", lw=1, label=f"zero limit with loss scale 2^{shift:.0f}")
    ax.set(xlabel="log2 |gradient|", ylabel="density", title=f"Real gradients of the reference model vs {name}")
    ax.legend(fontsize=8, loc="upper right")
    plt.show()


def lost_in_backward(reference: torch.Tensor, low: torch.Tensor) -> float:
    """Fraction of the non-zero entries of ``reference`` (float32 activation gradients) that are exactly 0 in
    ``low`` (the same gradients from a 16-bit backward pass, as returned by :func:`capture_gradients`)."""
    if reference.shape != low.shape:
        raise ValueError(f"the two runs caught different gradients: {tuple(reference.shape)} vs {tuple(low.shape)}")
    nonzero = reference != 0
    return ((low == 0) & nonzero).sum().item() / nonzero.sum().item()


# --- the faint task ----------------------------------------------------------------------------------------------

def faint_data(device: Device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The faint task's inputs (``FAINT_BATCH x FAINT_FEATURES`` standard normal values from a seeded generator)
    and its target, ``FAINT_FACTOR * inputs``."""
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(FAINT_BATCH, FAINT_FEATURES, generator=generator).to(device)
    return inputs, FAINT_FACTOR * inputs


def faint_net(device: Device = "cpu") -> nn.Sequential:
    """``Linear -> ReLU -> Linear`` in float32, seeded, with the last layer initialised to zero (as output and
    residual layers often are), so its output starts at exactly 0."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(FAINT_FEATURES, FAINT_FEATURES), nn.ReLU(), nn.Linear(FAINT_FEATURES, FAINT_FEATURES))
    nn.init.zeros_(net[2].weight)
    nn.init.zeros_(net[2].bias)
    return net.to(device)


def faint_loss(net: nn.Module, amp_dtype: torch.dtype | None = torch.float16) -> tuple[torch.Tensor, torch.Tensor]:
    """The faint task's mean squared error and the network's output, the forward pass under autocast in
    ``amp_dtype`` (``None``: float32). The data go to the device of ``net``'s parameters."""
    device = next(net.parameters()).device
    inputs, target = faint_data(device)
    with torch.amp.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
        output = net(inputs)
        return F.mse_loss(output, target), output


@dataclass
class FaintRun:
    """One training run of the faint task."""

    losses: list[float]             # the loss at every step
    zero_output_grads: list[float]  # per step: fraction of the output's gradients that are exactly 0

    @property
    def final_ratio(self) -> float:
        """Last loss / first loss."""
        return self.losses[-1] / self.losses[0]


def train_faint(amp_dtype: torch.dtype | None, use_scaler: bool, steps: int = 30,
                device: Device = "cpu") -> FaintRun:
    """Train a fresh :func:`faint_net` for ``steps`` Adam steps (lr :data:`FAINT_LR`): float32 (``amp_dtype=None``)
    or autocast in ``amp_dtype``, with a ``torch.amp.GradScaler`` or without (``enabled=False`` passes through)."""
    device = torch.device(device)
    net = faint_net(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=FAINT_LR)
    scaler = torch.amp.GradScaler(device.type, enabled=use_scaler)
    run = FaintRun([], [])
    with strict_fp32():
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            loss, output = faint_loss(net, amp_dtype)
            output.retain_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            run.losses.append(loss.item())
            run.zero_output_grads.append((output.grad == 0).float().mean().item())
    return run


def format_runs(runs: dict[str, FaintRun]) -> str:
    """One line per run: final loss / initial loss, and the share of zero output gradients at the first and
    the last step."""
    width = max(len(name) for name in runs)
    return "\n".join(f"{name:>{width}}: final loss / initial {run.final_ratio:.3f}; output gradients that are 0: "
                     f"{run.zero_output_grads[0]:.0%} at step 0, {run.zero_output_grads[-1]:.0%} at the end"
                     for name, run in runs.items())


def plot_losses(runs: dict[str, FaintRun]) -> None:
    """Loss / initial loss per step for each run, on a log scale."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=80)
    for name, run in runs.items():
        ax.plot([v / run.losses[0] for v in run.losses], label=name, ls="--" if "GradScaler" in name else "-")
    ax.set(xlabel="step", ylabel="loss / initial loss", yscale="log", title="Faint target: float16 with and "
           "without a scaler")
    ax.legend()
    plt.show()


def fp16_training_ratio(net: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                        steps: int = 30) -> float:
    """Train ``net`` on the faint task for ``steps`` steps of the GradScaler recipe (forward under float16
    autocast, ``scaler.scale(loss).backward()``, ``scaler.step``, ``scaler.update``); returns last loss / first
    loss. Whatever is wrong with ``net``, ``optimizer`` or ``scaler`` shows as an error or a poor ratio."""
    losses = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss, _ = faint_loss(net, torch.float16)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    return losses[-1] / losses[0]


# --- the dynamic scale -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ScaleStep:
    """One step of :func:`scale_history`."""

    step: int
    scale_before: float
    scale_after: float
    weights_unchanged: bool    # bit-for-bit
    optimizer_unchanged: bool  # Adam's step count and moments, bit-for-bit
    injected: float | None     # the inf or NaN written into one gradient element, if any

    @property
    def skipped(self) -> bool:
        """The scale went down: ``step()`` found inf/NaN and skipped ``optimizer.step()`` (one optimizer)."""
        return self.scale_after < self.scale_before


def scale_history(steps: int, inject: dict[int, float], *, init_scale: float = 2.0**10, growth_interval: int = 4,
                  device: Device = "cpu") -> list[ScaleStep]:
    """Train the faint task in float16 with a ``GradScaler`` for ``steps`` steps, writing ``inject[step]`` (inf or
    NaN) into one gradient element at the steps listed; record the scale and whether the step changed anything."""
    device = torch.device(device)
    net = faint_net(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=FAINT_LR)
    scaler = torch.amp.GradScaler(device.type, init_scale=init_scale, growth_interval=growth_interval)
    history = []
    for step in range(steps):
        weights, state = snapshot(net), optimizer_snapshot(optimizer)
        optimizer.zero_grad(set_to_none=True)
        loss, _ = faint_loss(net)
        scaler.scale(loss).backward()
        if step in inject:
            net[0].weight.grad[0, 0] = inject[step]
        scale_before = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        history.append(ScaleStep(step, scale_before, scaler.get_scale(), same_state(weights, snapshot(net)),
                                 same_state(state, optimizer_snapshot(optimizer)), inject.get(step)))
    return history


def plot_scale_history(history: list[ScaleStep]) -> None:
    """The scale after each ``update()``, with the injected steps marked."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=80)
    ax.step([h.step for h in history], [h.scale_after for h in history], where="post", label="scale after update()")
    bad = [h for h in history if h.injected is not None]
    ax.plot([h.step for h in bad], [h.scale_after for h in bad], "rx", label="injected inf / NaN")
    ax.set(xlabel="step", ylabel="scale", title="GradScaler: back-off on inf/NaN, growth after clean steps")
    ax.set_yscale("log", base=2)
    ax.legend()
    plt.show()


# --- clipping ----------------------------------------------------------------------------------------------------

StepFn = Callable[[nn.Module, torch.optim.Optimizer, torch.amp.GradScaler, torch.Tensor, float], None]


def _clipping_net(device: torch.device) -> nn.Sequential:
    net = faint_net(device)
    with torch.no_grad():
        net[2].weight.fill_(0.01)  # a non-zero last layer, so that every layer has a gradient
    return net


def true_gradient_norm(device: Device = "cpu") -> float:
    """The float32 gradient norm of the clipping experiment's network (what clipping should compare with)."""
    net = _clipping_net(torch.device(device))
    with strict_fp32():
        loss, _ = faint_loss(net, None)
        loss.backward()
    return nn.utils.clip_grad_norm_(net.parameters(), float("inf")).item()


def unscale_then_clip(model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                      loss: torch.Tensor, max_norm: float) -> None:
    """The recipe's step with clipping (a ``step_fn`` for :func:`update_norm`): scale and backward, ``unscale_``,
    clip the true gradient norm to ``max_norm``, then ``step`` and ``update``."""
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()


def update_norm(step_fn: StepFn, max_norm: float = CLIP_NORM, device: Device = "cpu") -> float:
    """The size of one clipped SGD update (learning rate 1): the norm of the change of all weights.

    A fresh network of the faint task (last layer 0.01), ``torch.optim.SGD(lr=1.0)`` and a ``GradScaler`` at
    2^16 compute a float16-autocast loss, then ``step_fn(model, optimizer, scaler, loss, max_norm)`` does the rest
    (backward, clipping, step, update). With the gradient clipped right, the update's norm is ``max_norm``.
    """
    device = torch.device(device)
    net = _clipping_net(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=1.0)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**16)
    before = [p.detach().clone() for p in net.parameters()]
    loss, _ = faint_loss(net)
    step_fn(net, optimizer, scaler, loss, max_norm)
    return torch.cat([(b - p.detach()).flatten() for b, p in zip(before, net.parameters())]).norm().item()


# --- checkpoints -------------------------------------------------------------------------------------------------

class TrainingState(NamedTuple):
    """Everything a float16 training run carries from step to step."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler


def fresh_state(device: Device = "cpu", growth_interval: int = 3) -> TrainingState:
    """A new faint-task run: network, Adam, a StepLR schedule, and a GradScaler with a short growth interval
    (so that its scale changes within a few steps)."""
    device = torch.device(device)
    net = faint_net(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=FAINT_LR)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)
    return TrainingState(net, optimizer, scheduler, torch.amp.GradScaler(device.type, growth_interval=growth_interval))


def train_steps(state: TrainingState, steps: int) -> None:
    """``steps`` steps of the float16 recipe on the faint task; the scheduler steps only after a step that ran
    (a lower scale after ``update()`` means the scaler skipped it)."""
    for _ in range(steps):
        state.optimizer.zero_grad(set_to_none=True)
        loss, _ = faint_loss(state.model)
        state.scaler.scale(loss).backward()
        scale_before = state.scaler.get_scale()
        state.scaler.step(state.optimizer)
        state.scaler.update()
        if state.scaler.get_scale() >= scale_before:
            state.scheduler.step()


def same_run(a: TrainingState, b: TrainingState) -> bool:
    """True when two runs hold bit-for-bit the same weights and optimizer state (Adam's step count and moments)."""
    return (same_state(snapshot(a.model), snapshot(b.model))
            and same_state(optimizer_snapshot(a.optimizer), optimizer_snapshot(b.optimizer)))


def save_and_load(checkpoint: dict) -> dict:
    """``checkpoint`` written with ``torch.save`` to memory and read back with ``torch.load(weights_only=True)``."""
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


SaveFn = Callable[[nn.Module, torch.optim.Optimizer, torch.amp.GradScaler], dict]
LoadFn = Callable[[dict, nn.Module, torch.optim.Optimizer, torch.amp.GradScaler], None]


def resumed_scale(save: SaveFn, load: LoadFn, steps: int = 7, device: Device = "cpu") -> float:
    """The scale a resumed run starts from: train the faint task for ``steps`` steps, build a checkpoint with
    ``save(model, optimizer, scaler)``, write and read it (``torch.save``/``torch.load(weights_only=True)``), give
    it to ``load(checkpoint, model, optimizer, scaler)`` with fresh objects, and read the fresh scaler's scale."""
    run = fresh_state(device)
    train_steps(run, steps)
    checkpoint = save_and_load(save(run.model, run.optimizer, run.scaler))
    resumed = fresh_state(device)
    load(checkpoint, resumed.model, resumed.optimizer, resumed.scaler)
    return resumed.scaler.get_scale()
