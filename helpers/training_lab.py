"""Notebook 03's experiments on float32 vs autocast training, as one-line calls: curves and accuracy
(:func:`compare_training`), step time (:func:`time_training_step`), activation memory (:func:`activation_memory`).

Every float32 baseline runs under :func:`helpers.device.strict_fp32` (on a GPU, no TF32), and float16 autocast
gets a ``GradScaler``, as the course's recipe says.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from .data import make_loader, shapes_dataset
from .device import needs_grad_scaler, strict_fp32
from .measure import fastest_time, parameter_bytes, saved_activation_bytes_by_dtype
from .model import ShapesCNN
from .train import TrainLog, amp_step, evaluate, make_scaler, train

MB = 2**20


def _name(amp_dtype: torch.dtype | None) -> str:
    return "float32" if amp_dtype is None else f"autocast {str(amp_dtype).removeprefix('torch.')}"


def _smooth(values: list[float], k: int = 10) -> list[float]:
    return [sum(values[max(0, i - k + 1): i + 1]) / len(values[max(0, i - k + 1): i + 1]) for i in range(len(values))]


@dataclass
class TrainingComparison:
    """Two runs from the same seed and data order, float32 and autocast: losses per step, test accuracy."""

    logs: dict[str, TrainLog]     # "float32" / "autocast bfloat16" -> the run's log
    accuracy: dict[str, float]    # the same keys -> test accuracy
    epochs: int
    examples: int
    test_examples: int

    @property
    def names(self) -> tuple[str, str]:
        return tuple(self.logs)  # type: ignore[return-value]

    def first_loss_gap(self) -> float:
        """Relative difference of the two runs' first loss (same weights, same batch: only rounding differs)."""
        first = [log.losses[0] for log in self.logs.values()]
        return abs(first[1] - first[0]) / first[0]

    def final_loss_gap(self, k: int = 10) -> float:
        """Relative difference of the two runs' mean loss over their last ``k`` steps."""
        last = [sum(log.losses[-k:]) / len(log.losses[-k:]) for log in self.logs.values()]
        return abs(last[1] - last[0]) / last[0]

    def accuracy_gap(self) -> float:
        """Absolute difference of the two test accuracies."""
        values = list(self.accuracy.values())
        return abs(values[1] - values[0])

    def __repr__(self) -> str:
        steps = len(next(iter(self.logs.values())).losses)
        lines = [f"{self.epochs} epochs on {self.examples} images ({steps} steps), test set {self.test_examples}:"]
        for name, log in self.logs.items():
            skipped = f", {log.skipped_steps} steps skipped by the scaler" if log.scales else ""
            lines.append(f"  {name:<18} first loss {log.losses[0]:.4f}, mean of last 10 "
                         f"{sum(log.losses[-10:]) / len(log.losses[-10:]):.3f}, "
                         f"test accuracy {self.accuracy[name]:.1%}{skipped}")
        return "\n".join(lines)

    def plot(self, ax=None) -> None:
        """Both loss curves (raw, faint, and a 10-step mean) on a log scale (on ``ax``, or a new figure)."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(6, 3.5), dpi=80)
        for name, log in self.logs.items():
            line, = ax.plot(_smooth(log.losses), label=f"{name} (10-step mean)")
            ax.plot(log.losses, color=line.get_color(), alpha=0.2)
        ax.set(xlabel="training step", ylabel="cross-entropy loss", yscale="log",
               title="float32 vs autocast, same seed")
        ax.legend()


def compare_training(device: torch.device, amp_dtype: torch.dtype, *, examples: int, test_examples: int,
                     epochs: int = 2, batch_size: int = 32, max_lr: float = 2e-2) -> TrainingComparison:
    """Train ``ShapesCNN`` twice from seed 0 on the first ``examples`` training images, in float32 and under
    autocast with ``amp_dtype`` (plus a ``GradScaler`` for float16), AdamW with a one-cycle schedule; evaluate
    each on the first ``test_examples`` test images (in its own precision)."""
    train_set, test_set = shapes_dataset("train", n=examples), shapes_dataset("test", n=test_examples)
    logs, accuracy = {}, {}
    for amp in (None, amp_dtype):
        torch.manual_seed(0)
        model = ShapesCNN().to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=max_lr, weight_decay=1e-4)
        loader = make_loader(train_set, batch_size=batch_size, seed=0)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr, total_steps=epochs * len(loader))
        scaler = make_scaler(device.type, amp) if needs_grad_scaler(amp) else None
        logs[_name(amp)] = train(model, loader, optimizer, epochs=epochs, amp_dtype=amp, scaler=scaler,
                                 scheduler=scheduler)
        accuracy[_name(amp)] = evaluate(model, test_set, amp_dtype=amp).accuracy
    return TrainingComparison(logs, accuracy, epochs, examples, test_examples)


@dataclass
class StepTimes:
    """Seconds per training step (forward, loss, backward, optimizer step) of float32 and autocast."""

    seconds: dict[str, float]
    batch_size: int

    @property
    def speedup(self) -> float:
        """float32 time / autocast time (> 1: autocast was faster in this measurement)."""
        fp32, amp = self.seconds.values()
        return fp32 / amp

    def __repr__(self) -> str:
        parts = [f"{name} {seconds * 1e3:.1f} ms" for name, seconds in self.seconds.items()]
        verdict = "faster" if self.speedup > 1 else "not faster"
        return (f"one training step, batch {self.batch_size}: " + ", ".join(parts) +
                f"; autocast/float32 speed {self.speedup:.2f}x: on this machine, this run, autocast was {verdict}")


def time_training_step(device: torch.device, amp_dtype: torch.dtype, *, batch_size: int = 32, rounds: int = 2,
                       min_run_time: float = 0.2) -> StepTimes:
    """Time one ``ShapesCNN`` training step (AdamW) in float32 and under autocast with ``torch.utils.benchmark``
    (warm-up excluded), in ``rounds`` alternating rounds, keeping each one's fastest block: other load on the
    machine can only slow a block down."""
    inputs, labels = (t.to(device) for t in shapes_dataset("train", n=batch_size).tensors)
    steps = {}
    for amp in (None, amp_dtype):
        torch.manual_seed(0)
        model = ShapesCNN().to(device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = make_scaler(device.type, amp) if needs_grad_scaler(amp) else None
        steps[_name(amp)] = (lambda m=model, o=optimizer, a=amp, s=scaler:
                             amp_step(m, inputs, labels, o, amp_dtype=a, scaler=s))
    seconds = {name: math.inf for name in steps}
    with strict_fp32():
        for _ in range(rounds):
            for name, step in steps.items():
                seconds[name] = min(seconds[name], fastest_time(step, min_run_time=min_run_time))
    return StepTimes(seconds, batch_size)


@dataclass
class ActivationMemory:
    """Bytes autograd saves for backward in one forward pass + loss, per batch size, mode and dtype."""

    saved: dict[int, dict[str, dict[torch.dtype, int]]]  # batch -> "float32"/"autocast ..." -> dtype -> bytes
    state_bytes: int  # float32 parameters + gradients + AdamW's two moment buffers (autocast leaves them float32)

    def total(self, batch: int, name: str) -> int:
        return sum(self.saved[batch][name].values())

    def saving(self, batch: int, with_state: bool = False) -> float:
        """Fraction of the float32 bytes that autocast saves at ``batch`` (optionally counting the training state)."""
        extra = self.state_bytes if with_state else 0
        fp32, amp = (self.total(batch, name) + extra for name in self.saved[batch])
        return 1 - amp / fp32

    def __repr__(self) -> str:
        lines = []
        for batch, modes in self.saved.items():
            fp32, amp = modes
            lines.append(f"batch {batch:>3}: saved for backward {self.total(batch, fp32) / MB:6.2f} MB {fp32} -> "
                         f"{self.total(batch, amp) / MB:6.2f} MB {amp} ({self.saving(batch):.0%} less; "
                         f"{self.saving(batch, with_state=True):.0%} less counting the "
                         f"{self.state_bytes / MB:.2f} MB training state)")
        batch = next(iter(self.saved))
        for name, split in self.saved[batch].items():
            lines.append(f"batch {batch:>3}, {name} by dtype: " +
                         ", ".join(f"{str(d).removeprefix('torch.')} {n / MB:.2f} MB" for d, n in split.items()))
        return "\n".join(lines)


def activation_memory(device: torch.device, amp_dtype: torch.dtype, batches: tuple[int, ...] = (128, 8)
                      ) -> ActivationMemory:
    """Count the activation bytes a ``ShapesCNN`` training step keeps for backward, float32 vs autocast, with
    :func:`helpers.measure.saved_activation_bytes_by_dtype` (the model's parameters excluded)."""
    torch.manual_seed(0)
    model = ShapesCNN().to(device).train()
    data = [t.to(device) for t in shapes_dataset("train", n=max(batches)).tensors]
    saved: dict[int, dict[str, dict[torch.dtype, int]]] = {}
    for batch in batches:
        inputs, labels = (t[:batch].clone() for t in data)  # clone: a view would count the whole storage

        def forward(amp: torch.dtype | None = None) -> torch.Tensor:
            with torch.amp.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
                return F.cross_entropy(model(inputs), labels)

        with strict_fp32():
            saved[batch] = {_name(amp): saved_activation_bytes_by_dtype(lambda a=amp: forward(a), exclude=model)
                            for amp in (None, amp_dtype)}
    state = 4 * parameter_bytes(model, include_buffers=False)
    return ActivationMemory(saved, state)
