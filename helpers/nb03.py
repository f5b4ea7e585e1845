"""Notebook 03's scaffolding: section 4's float32-vs-autocast training comparison."""

from dataclasses import dataclass

import torch

from .data import make_loader, shapes_dataset
from .device import needs_grad_scaler
from .model import ShapesCNN
from .train import TrainLog, evaluate, make_scaler, train


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


def compare_training(device: torch.device, amp_dtype: torch.dtype, *, examples: int,
                     test_examples: int, epochs: int = 2, batch_size: int = 32,
                     max_lr: float = 2e-2) -> TrainingComparison:
    """Train ``ShapesCNN`` from seed 0 in float32 and with autocast (AdamW, one-cycle); test both"""
    train_set = shapes_dataset("train", n=examples)
    test_set = shapes_dataset("test", n=test_examples)
    logs, accuracy = {}, {}
    for amp in (None, amp_dtype):
        torch.manual_seed(0)
        model = ShapesCNN().to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=max_lr, weight_decay=1e-4)
        loader = make_loader(train_set, batch_size=batch_size, seed=0)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr,
                                                        total_steps=epochs * len(loader))
        scaler = make_scaler(device.type, amp) if needs_grad_scaler(amp) else None
        logs[_name(amp)] = train(model, loader, optimizer, epochs=epochs, amp_dtype=amp,
                                 scaler=scaler, scheduler=scheduler)
        accuracy[_name(amp)] = evaluate(model, test_set, amp_dtype=amp).accuracy
    return TrainingComparison(logs, accuracy, epochs, examples, test_examples)
