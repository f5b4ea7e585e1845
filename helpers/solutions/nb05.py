"""Solutions of notebook 05 (DataParallel pitfall, DDP and FSDP), each computed with PyTorch."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..data import shapes_dataset
from ..ddp_train import fsdp2
from ..model import ShapesCNN
from ..nb05 import DtypeProbe, replay_data_parallel, run_in_thread


def replica_dtype_after_set_autocast_dtype() -> torch.dtype:
    """05.1: the main thread sets CPU autocast's dtype to float16 (``set_autocast_dtype``), then
    calls the 1.7+ re-enactment under ``autocast("cpu")`` without dtype: the replicas' output dtype.

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
    """05.2: a forward decorated with autocast("cpu") without dtype, float16 outside, 1.7+."""
    probe = _BareDecoratedProbe()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    with torch.amp.autocast("cpu", dtype=torch.float16):
        return replay_data_parallel(probe, x, behaviour="1.7+").dtype


def _gradients(model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(inputs), labels).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def half_batch_average_matches_full_batch() -> bool:
    """05.3: ShapesCNN in train mode: is the mean of two 16-image gradients allclose to the 32-image
    gradient?"""
    torch.manual_seed(0)
    model = ShapesCNN().train()
    inputs, labels = shapes_dataset("train", n=32).tensors
    full = _gradients(model, inputs, labels)
    halves = (_gradients(model, inputs[:16], labels[:16])
              + _gradients(model, inputs[16:], labels[16:])) / 2
    return torch.allclose(full, halves)


class TinyClassifier(nn.Module):
    """05.4, repaired: ``forward`` enters autocast with the model's own dtype, in every thread."""

    def __init__(self, amp_dtype: torch.dtype):
        super().__init__()
        self.amp_dtype = amp_dtype
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.amp.autocast(x.device.type, dtype=self.amp_dtype):
            return self.body(x)


def replica_output_dtypes(classifier: type) -> dict:
    """The output dtype of ``classifier(amp_dtype=d)`` under the 1.7+ re-enactment with float16
    outside, for d float16 and bfloat16 (a repair follows the model's dtype, not one typed in)."""
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    dtypes = {}
    for dtype in (torch.float16, torch.bfloat16):
        with torch.amp.autocast("cpu", dtype=torch.float16):
            dtypes[dtype] = replay_data_parallel(classifier(amp_dtype=dtype), x).dtype
    return dtypes


class FollowsItsDtype:
    """05.4's expected answer: equal to a classifier class whose replicas compute in the dtype it
    was built with (``answer == expected`` falls back to this ``__eq__``), never to a dtype."""

    def __eq__(self, answer: object) -> bool:
        if not isinstance(answer, type) or not issubclass(answer, nn.Module):
            return False
        try:
            return replica_output_dtypes(answer) == replica_output_dtypes(TinyClassifier)
        except Exception:  # a class that cannot be built or run is not a repair
            return False

    def __repr__(self) -> str:
        return "a classifier class whose replicas compute in the dtype it was built with"


def repaired_classifier() -> FollowsItsDtype:
    """05.4: the repaired classifier class (compared by running it: :class:`FollowsItsDtype`)."""
    return FollowsItsDtype()


def float32_reduction_policy():
    """05.5: compute in bfloat16, reduce gradients in float32 (unset, it is param_dtype)."""
    MixedPrecisionPolicy, _ = fsdp2()
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


SOLUTIONS = {
    "05.1": replica_dtype_after_set_autocast_dtype,
    "05.2": bare_decorator_output_dtype,
    "05.3": half_batch_average_matches_full_batch,
    "05.4": repaired_classifier,
    "05.5": float32_reduction_policy,
}
