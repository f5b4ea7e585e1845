"""Notebook 09's scaffolding: a step to time and profile, a slow data set, exercise 09.1's loop."""

import itertools
import time
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F
from torch.profiler import ProfilerActivity, profile, record_function
from .device import quiet_native_stderr
from .dtype_trace import OpObserver

# An event's category: that of its outermost matching event (the optimizer's casts: optimizer)
CATEGORIES = {"casts": ("aten::_to_copy",),
              "matmuls": ("aten::mm", "aten::addmm", "aten::bmm", "aten::convolution"),
              "optimizer": ("Optimizer.step",), "data loading": ("enumerate(DataLoader)",),
              "syncs": ("aten::item",)}


def mlp(width: int, depth: int = 3, seed: int = 0) -> nn.Sequential:
    """``depth`` Linear(width, width) layers with a ReLU between them, seeded."""
    torch.manual_seed(seed)
    layers = [m for _ in range(depth) for m in (nn.Linear(width, width), nn.ReLU())]
    return nn.Sequential(*layers[:-1])


def batch(rows: int, width: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, width, generator=g), torch.randn(rows, width, generator=g)


class Step:
    """One step: autocast forward (``dtype`` None: float32), float32 MSE, backward, AdamW; ``data``:
    a pair or batches (re-read); ``sync=True``: ``.item()`` each step, as a logging loop does."""

    def __init__(self, model: nn.Module, dtype: torch.dtype | None, data, *, sync: bool = False):
        self.model, self.dtype, self.sync = model, dtype, sync
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.batches = (itertools.repeat(data) if isinstance(data, tuple)  # else re-read forever
                        else itertools.chain.from_iterable(itertools.repeat(data)))

    def __call__(self) -> torch.Tensor:
        x, y = next(self.batches)
        with torch.autocast("cpu", dtype=self.dtype or torch.bfloat16,
                            enabled=self.dtype is not None):
            loss = F.mse_loss(self.model(x).float(), y)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.sync:
            loss.item()  # what printing or logging the loss does
        return loss


def _category(event) -> str | None:
    return next((name for name, prefixes in CATEGORIES.items()
                 if event.name.startswith(prefixes)), None)


def profile_step(step: Callable[[], object], steps: int = 3):
    """The profiler of ``steps`` calls, and per category (events per step, share of CPU time)."""
    step()
    with quiet_native_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            with record_function("step"):
                step()
    total, counts, times = 0.0, dict.fromkeys(CATEGORIES, 0), dict.fromkeys(CATEGORIES, 0.0)
    for event in prof.events():
        if event.name == "step":
            total += event.cpu_time_total
            continue
        name, parent = _category(event), event.cpu_parent
        while name and parent is not None and parent.name != "step":
            name = None if _category(parent) else name  # counted in an outer event
            parent = parent.cpu_parent
        if name:
            counts[name] += 1
            times[name] += event.cpu_time_total
    shares = {name: (counts[name] / steps, times[name] / total) for name in CATEGORIES}
    shares["other"] = (float("nan"), 1 - sum(share for _, share in shares.values()))
    return prof, shares


def shares_line(shares: dict[str, tuple[float, float]]) -> str:
    return ", ".join(f"{name} {share:.0%}" + ("" if count != count else f" ({count:.3g}/step)")
                     for name, (count, share) in shares.items() if share >= 0.005 or count > 0)


class SlowPairs(torch.utils.data.Dataset):
    """``n`` seeded (input, target) rows; reading one sleeps ``delay`` s (a disk, CPU free)."""

    def __init__(self, n: int, width: int, delay: float, seed: int = 0):
        (self.x, self.y), self.delay = batch(n, width, seed), delay

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.delay)
        return self.x[i], self.y[i]


def ops(fn: Callable[[], object]) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """(name, shape, dtype) of each ATen op ``fn()`` runs with a tensor result, in order."""
    seen: list[tuple[str, tuple[int, ...], torch.dtype]] = []
    with OpObserver(lambda func, args, kwargs, out: isinstance(out, torch.Tensor) and seen.append(
            (func.overloadpacket.__name__, tuple(out.shape), out.dtype))):
        fn()
    return seen


def casts(fn: Callable[[], object]) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """The (shape, dtype) of the result of every cast that ``fn()`` dispatches."""
    return [(shape, dtype) for name, shape, dtype in ops(fn) if name in ("_to_copy", "to")]


def recurrent_setup(width: int = 32, steps: int = 8, seed: int = 0):
    """Exercise 09.1: a seeded cell ``Linear(2 * width, width)`` and ``steps`` inputs (batch 4)."""
    torch.manual_seed(seed)
    cell = nn.Linear(2 * width, width)
    inputs = torch.randn(steps, 4, width, generator=torch.Generator().manual_seed(seed + 1))
    return cell, inputs
