"""The dtype of every ATen operation a piece of code runs (below autocast, so casts are visible).
Taught in notebook 02 §3 (and used in 01, 03 §3 and 08)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


@dataclass(frozen=True)
class OpRecord:
    """One ATen operation: its name and the floating dtypes of its tensor inputs and outputs."""

    name: str
    input_dtypes: tuple[torch.dtype, ...]
    output_dtypes: tuple[torch.dtype, ...]


def _float_dtypes(values: Any) -> tuple[torch.dtype, ...]:
    return tuple(v.dtype for v in tree_leaves(values)
                 if isinstance(v, torch.Tensor) and v.is_floating_point())


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[OpRecord] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        self.records.append(OpRecord(name, _float_dtypes((args, kwargs)), _float_dtypes(out)))
        return out


def record_ops(fn: Callable[[], Any]) -> tuple[Any, list[OpRecord]]:
    """Run ``fn()`` and return its result with the ATen ops it dispatched, in order: under autocast,
    as autocast rewrote them (a ``_to_copy`` per cast); forward and backward. Notebook 02 §3."""
    with _Recorder() as recorder:
        result = fn()
    return result, recorder.records


CAST_OPS = ("to", "_to_copy")  # a cast: "to" under inference_mode on some versions, else "_to_copy"

GRAD_MODES: dict[str, Callable[[], Any]] = {
    "inference_mode": torch.inference_mode,
    "no_grad": torch.no_grad,
    "grad enabled (training)": torch.enable_grad,
}


def casts_per_call(module: torch.nn.Module, inputs: torch.Tensor, dtype: torch.dtype,
                   grad_mode: str, calls: int = 2) -> list[int]:
    """How many casts autocast makes in each of ``calls`` forward passes inside ONE autocast
    context, in the grad mode ``grad_mode`` (a key of :data:`GRAD_MODES`). The weight-cast cache:
    notebook 03 §7."""
    counts = []
    with GRAD_MODES[grad_mode](), torch.amp.autocast(inputs.device.type, dtype=dtype):
        for _ in range(calls):
            _, records = record_ops(lambda: module(inputs))
            counts.append(sum(record.name in CAST_OPS for record in records))
    return counts
