"""Notebook 09's scaffolding: its models and data, the shares' one-line format, exercise 09.1's loop;
copies of the step and the op log that notebook 09 section 1 types in its cells."""

import time

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode


def mlp(width: int, depth: int = 3, seed: int = 0) -> nn.Sequential:
    """``depth`` Linear(width, width) layers, ReLUs between them, seeded (global RNG untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers = []
        for _ in range(depth):
            layers.append(nn.Linear(width, width))
            layers.append(nn.ReLU())
    return nn.Sequential(*layers[:-1])


def batch(rows: int, width: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, width, generator=g), torch.randn(rows, width, generator=g)


def forever(data):
    """Batches of ``data`` without end: one (x, y) pair again and again, or pass after pass."""
    if isinstance(data, tuple):
        while True:
            yield data
    while True:
        yield from data  # a new pass over the loader each time one ends


# The training step and the op log below are notebook 09 section 1's cells, marked there as copies
# (tools/copies.py checks them); kept here for the exercise checks.
class Step:
    """One training step: forward under autocast in ``dtype`` (None: float32), the loss in float32,
    backward, AdamW, zero_grad; with float16 a GradScaler. ``sync``: ``.item()`` every step."""

    def __init__(self, model: nn.Module, dtype: torch.dtype | None, data, *, sync: bool = False):
        self.model = model
        self.dtype = dtype
        self.batches = forever(data)  # one (x, y) pair, or batches read again and again
        self.sync = sync
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        device_type = next(model.parameters()).device.type
        self.scaler = torch.amp.GradScaler(device_type, enabled=dtype == torch.float16)

    def __call__(self) -> torch.Tensor:
        x, y = next(self.batches)
        autocast_dtype = self.dtype or torch.bfloat16  # any dtype when autocast is off
        with torch.autocast(x.device.type, dtype=autocast_dtype, enabled=self.dtype is not None):
            loss = F.mse_loss(self.model(x).float(), y)  # the loss in float32
        self.scaler.scale(loss).backward()  # outside autocast; unscaled when the scaler is off
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.sync:
            loss.item()  # what printing or logging the loss does
        return loss


class OpLog(TorchDispatchMode):
    """In ``with OpLog() as log:``, each ATen op returning a tensor is logged."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))  # run the op itself (the mode is off in here)
        if isinstance(out, torch.Tensor):
            self.seen.append((func.overloadpacket.__name__, tuple(out.shape), out.dtype))
        return out


def ops(fn) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    with OpLog() as log:
        fn()
    return log.seen


def casts(fn) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """The (shape, dtype) of the result of every cast that ``fn()`` runs."""
    return [(shape, dtype) for name, shape, dtype in ops(fn) if name in ("_to_copy", "to")]


def shares_line(shares: dict[str, tuple[float, float]]) -> str:
    """``profile_step``'s shares (09's cell) on one line: each category's share, its events per step."""
    return ", ".join(f"{name} {share:.0%}" + ("" if count != count else f" ({count:.3g}/step)")
                     for name, (count, share) in shares.items() if share >= 0.005 or count > 0)


class SlowPairs(torch.utils.data.Dataset):
    """``n`` seeded (input, target) rows; reading one sleeps ``delay`` s: it stands in for waiting
    on a disk or the network (I/O wait: the CPU is free meanwhile), not decoding (a busy core)."""

    def __init__(self, n: int, width: int, delay: float, seed: int = 0):
        (self.x, self.y), self.delay = batch(n, width, seed), delay

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.delay)
        return self.x[i], self.y[i]


def recurrent_setup(width: int = 32, steps: int = 8, seed: int = 0):
    """Exercise 09.1: a seeded cell ``Linear(2 * width, width)`` and ``steps`` inputs (batch 4)."""
    with torch.random.fork_rng(devices=[]):  # the learner's global RNG is left as it was
        torch.manual_seed(seed)
        cell = nn.Linear(2 * width, width)
    inputs = torch.randn(steps, 4, width, generator=torch.Generator().manual_seed(seed + 1))
    return cell, inputs


def shares_reason(timing, shares: dict[str, dict]) -> str:
    """Why a bfloat16-autocast step (``timing``: a :class:`helpers.timing.Comparison` against
    float32) came out as it did, from each step's profiled shares (``shares["float32"]``,
    ``shares["bfloat16"]``: :func:`profile_step`'s) times its per-step time from the same rounds as
    the ratio; "unexplained here" where the shares do not cover the difference."""
    loading = [shares[name]["data loading"][1] for name in ("float32", "bfloat16")]
    if min(loading) >= 0.5:
        return (f"data loading takes {loading[0]:.0%} and {loading[1]:.0%} of the two steps: the "
                "dtype of the arithmetic cannot change that part")
    if timing.verdict not in ("faster", "slower"):
        return f"no reason given: {timing.verdict}"
    ms = {"float32": timing.baseline_s * 1e3, "bfloat16": timing.candidate_s * 1e3}
    part = {(name, k): ms[name] * shares[name][k][1] for name in ms for k in ("casts", "matmuls")}
    lost = ms["bfloat16"] - ms["float32"]  # above 0: bfloat16 slower
    saved = part["float32", "matmuls"] - part["bfloat16", "matmuls"]
    numbers = (f"step {ms['float32']:.2f} -> {ms['bfloat16']:.2f} ms, matmuls "
               f"{part['float32', 'matmuls']:.2f} -> {part['bfloat16', 'matmuls']:.2f} ms, casts "
               f"{part['float32', 'casts']:.2f} -> {part['bfloat16', 'casts']:.2f} ms")
    added = part["bfloat16", "casts"] - part["float32", "casts"]
    if lost > 0 and added - saved >= 0.5 * lost:
        return f"the casts autocast adds and the matmuls' change cover most of the time lost ({numbers})"
    if lost < 0 and saved >= 0.5 * -lost:
        return f"the matmuls' time fell by more than half of what the step saved ({numbers})"
    return f"unexplained here ({numbers})"
