"""Notebook 03's scaffolding: section 3's op table; section 4's float32-vs-autocast runs of the
notebook's training step, and how its measured speed compares with the precision rule."""

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .autocast_rules import BOOKKEEPING_OPS
from .data import make_loader, shapes_dataset
from .device import needs_grad_scaler, strict_fp32, tf32_flags
from .model import ShapesCNN
from .training import TrainLog, evaluate, make_scaler, train


def _name(amp_dtype: torch.dtype | None) -> str:
    return "float32" if amp_dtype is None else f"autocast {str(amp_dtype).removeprefix('torch.')}"


def _mean_of_last(values: list[float], k: int = 10) -> float:
    return sum(values[-k:]) / len(values[-k:])


@dataclass
class TrainingComparison:
    """Two runs from the same seed and data order, float32 and autocast: losses, test accuracy."""

    logs: dict[str, TrainLog]     # "float32" / "autocast bfloat16" -> the run's log
    accuracy: dict[str, float]    # the same keys -> test accuracy
    epochs: int
    examples: int
    test_examples: int

    def first_loss_gap(self) -> float:
        """Relative gap of the first losses (same weights and batch: only rounding differs)."""
        first, other = (log.losses[0] for log in self.logs.values())
        return abs(other - first) / first

    def final_loss_gap(self, k: int = 10) -> float:
        """Relative difference of the two runs' mean loss over their last ``k`` steps."""
        first, other = (_mean_of_last(log.losses, k) for log in self.logs.values())
        return abs(other - first) / first

    def accuracy_gap(self) -> float:
        first, other = self.accuracy.values()
        return abs(other - first)

    def __repr__(self) -> str:
        steps = len(next(iter(self.logs.values())).losses)
        lines = [f"{self.epochs} epochs on {self.examples} images ({steps} steps), "
                 f"test set {self.test_examples}:"]
        for name, log in self.logs.items():
            skipped = f", {log.skipped_steps} steps skipped by the scaler" if log.scales else ""
            lines.append(f"  {name:<18} first loss {log.losses[0]:.4f}, mean of last 10 "
                         f"{_mean_of_last(log.losses):.3f}, "
                         f"test accuracy {self.accuracy[name]:.1%}{skipped}")
        return "\n".join(lines)

    def plot(self) -> None:
        """Both loss curves (raw, faint, and a 10-step mean) on a log scale."""
        import matplotlib.pyplot as plt
        _, ax = plt.subplots(figsize=(6, 3.5), dpi=80)
        for name, log in self.logs.items():
            smooth = [_mean_of_last(log.losses[: i + 1]) for i in range(len(log.losses))]
            line, = ax.plot(smooth, label=f"{name} (10-step mean)")
            ax.plot(log.losses, color=line.get_color(), alpha=0.2)
        ax.set(xlabel="training step", ylabel="cross-entropy loss", yscale="log",
               title="float32 vs autocast, same seed")
        ax.legend()


def dtype_counts(ops: list[tuple[str, list[torch.dtype]]]) -> dict[str, str]:
    """Each op name of a recorded list of (name, output dtypes) with its output dtypes counted, in
    the order first seen: ``{"convolution": "bfloat16 x4", ...}`` (section 3); bookkeeping ops
    (autograd's ``detach``, BatchNorm's counter) left out."""
    counts: dict[str, dict[str, int]] = {}
    for name, dtypes in ops:
        if name in BOOKKEEPING_OPS:
            continue
        per_dtype = counts.setdefault(name, {})
        for dtype in dtypes:
            dtype_name = str(dtype).removeprefix("torch.")
            per_dtype[dtype_name] = per_dtype.get(dtype_name, 0) + 1
    return {name: ", ".join(f"{dtype} x{n}" for dtype, n in sorted(per_dtype.items()))
            for name, per_dtype in counts.items()}


def compare_training(step: Callable, device: torch.device, amp_dtype: torch.dtype, *, examples: int,
                     test_examples: int, epochs: int = 2, batch_size: int = 32,
                     max_lr: float = 2e-2) -> TrainingComparison:
    """Train ``ShapesCNN`` from seed 0 with the notebook's ``step``, in float32 and with autocast
    (AdamW, one-cycle schedule, a ``GradScaler`` for float16); test both."""
    train_set = shapes_dataset("train", n=examples)
    test_set = shapes_dataset("test", n=test_examples)
    logs = {}
    accuracy = {}
    for amp in (None, amp_dtype):
        torch.manual_seed(0)
        model = ShapesCNN().to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=max_lr, weight_decay=1e-4)
        loader = make_loader(train_set, batch_size=batch_size, seed=0)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr,
                                                        total_steps=epochs * len(loader))
        scaler = None
        if needs_grad_scaler(amp):
            scaler = make_scaler(device.type, amp)
        logs[_name(amp)] = train(model, loader, optimizer, epochs=epochs, amp_dtype=amp,
                                 scaler=scaler, scheduler=scheduler, step=step)
        accuracy[_name(amp)] = evaluate(model, test_set, amp_dtype=amp).accuracy
    return TrainingComparison(logs, accuracy, epochs, examples, test_examples)


def float32_baselines(device: torch.device) -> dict[str, Callable[[], contextlib.AbstractContextManager]]:
    """The float32 baselines that differ on ``device``, each a context to time it in: strict float32
    everywhere; on an NVIDIA GPU from Ampere (sm_80) on also PyTorch's defaults as this process has
    them (TF32 for cuDNN convolutions, not for matmuls, unless the environment changed them: the
    cell prints the flags) and full TF32 (``set_float32_matmul_precision("high")`` and cuDNN).
    Elsewhere TF32 does not exist, so the three are one. Untested on a GPU here (simulated)."""
    baselines = {"strict float32": strict_fp32}
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8:
        baselines["PyTorch's defaults"] = contextlib.nullcontext
        baselines["full TF32"] = lambda: tf32_flags(True)
    return baselines


def tf32_in_effect() -> str:
    """The two TF32 switches as they are now (printed beside each baseline)."""
    return (f"TF32 matmuls {torch.backends.cuda.matmul.allow_tf32}, "
            f"TF32 cuDNN {torch.backends.cudnn.allow_tf32}")
