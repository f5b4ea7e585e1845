"""Solutions of notebook 05 (DataParallel pitfall and DDP), each computed with PyTorch."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..data import shapes_dataset
from ..model import ShapesCNN
from ..threads import DtypeProbe, replay_data_parallel, run_in_thread


def replica_dtype_after_set_autocast_dtype() -> torch.dtype:
    """05.1: the main thread sets CPU autocast's dtype to float16 with ``torch.set_autocast_dtype``, then calls the
    1.7+ re-enactment under ``autocast("cpu")`` without dtype: the replicas' output dtype.

    Runs in a thread of its own, so the caller's autocast dtype is left alone.
    """
    def experiment() -> torch.dtype:
        torch.set_autocast_dtype("cpu", torch.float16)  # this thread's state only
        probe = DtypeProbe()
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
        with torch.amp.autocast("cpu"):
            return replay_data_parallel(probe, x, behaviour="1.7+").dtype

    return run_in_thread(experiment, name="main-of-the-exercise")


class _BareDecoratedProbe(DtypeProbe):
    @torch.amp.autocast("cpu")  # no dtype: the default, read when this autocast object is created
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.observe(x)


def bare_decorator_output_dtype() -> torch.dtype:
    """05.2: a forward decorated with autocast("cpu") without dtype, float16 outside, 1.7+ re-enactment."""
    probe = _BareDecoratedProbe()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    with torch.amp.autocast("cpu", dtype=torch.float16):
        return replay_data_parallel(probe, x, behaviour="1.7+").dtype


def _gradients(model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(inputs), labels).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def half_batch_average_matches_full_batch() -> bool:
    """05.3: ShapesCNN in train mode: is the mean of two 16-image gradients allclose to the 32-image gradient?"""
    torch.manual_seed(0)
    model = ShapesCNN().train()
    inputs, labels = shapes_dataset("train", n=32).tensors
    full = _gradients(model, inputs, labels)
    halves = (_gradients(model, inputs[:16], labels[:16]) + _gradients(model, inputs[16:], labels[16:])) / 2
    return torch.allclose(full, halves)


class TinyClassifier(nn.Module):
    """05.4, repaired: ``forward`` enters autocast with the model's own dtype, so every thread uses it."""

    def __init__(self, amp_dtype: torch.dtype):
        super().__init__()
        self.amp_dtype = amp_dtype
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.amp.autocast(x.device.type, dtype=self.amp_dtype):
            return self.body(x)


def repaired_classifier_replica_dtype() -> torch.dtype:
    """05.4: the output dtype of the repaired float16 classifier under the 1.7+ re-enactment, float16 outside."""
    model = TinyClassifier(amp_dtype=torch.float16)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    with torch.amp.autocast("cpu", dtype=torch.float16):
        return replay_data_parallel(model, x).dtype


SOLUTIONS = {
    "05.1": replica_dtype_after_set_autocast_dtype,
    "05.2": bare_decorator_output_dtype,
    "05.3": half_batch_average_matches_full_batch,
    "05.4": repaired_classifier_replica_dtype,
}
