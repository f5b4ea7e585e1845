"""See the dtype of every ATen operation a piece of code runs (below autocast, so casts are visible)."""
from __future__ import annotations

from collections import Counter
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

    @property
    def mixes_dtypes(self) -> bool:
        """True when the op's floating inputs have more than one dtype (type promotion happens)."""
        return len(set(self.input_dtypes)) > 1


def _float_dtypes(values: Any) -> tuple[torch.dtype, ...]:
    return tuple(v.dtype for v in tree_leaves(values) if isinstance(v, torch.Tensor) and v.is_floating_point())


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
    """Run ``fn()`` and return its result with the ATen ops it dispatched, in order.

    Under autocast the records show the ops as autocast rewrote them: a ``_to_copy`` for each cast and,
    e.g., ``convolution`` with bfloat16 inputs. Works on CPU and GPU, forward and backward.
    """
    with _Recorder() as recorder:
        result = fn()
    return result, recorder.records


def dtype_summary(records: list[OpRecord]) -> dict[str, Counter]:
    """For each op name, how often each output dtype was produced: {'convolution': {bfloat16: 4}, ...}."""
    summary: dict[str, Counter] = {}
    for record in records:
        for dtype in record.output_dtypes:
            summary.setdefault(record.name, Counter())[dtype] += 1
    return summary


CAST_OPS = ("to", "_to_copy")  # a cast dispatches as "to" under inference_mode on some versions, else "_to_copy"

GRAD_MODES: dict[str, Callable[[], Any]] = {
    "inference_mode": torch.inference_mode,
    "no_grad": torch.no_grad,
    "grad enabled (training)": torch.enable_grad,
}


def casts_per_call(module: torch.nn.Module, inputs: torch.Tensor, dtype: torch.dtype, grad_mode: str,
                   calls: int = 2) -> list[int]:
    """How many casts autocast makes in each of ``calls`` forward passes inside ONE autocast context.

    ``grad_mode`` is a key of :data:`GRAD_MODES`. Autocast keeps the 16-bit copy of a weight (a leaf tensor that
    requires grad) in a cache until the context exits, so a later call inside the same context may skip casts
    that the first call made; the input is cast again every time (it is a new tensor each call).
    """
    counts = []
    with GRAD_MODES[grad_mode](), torch.amp.autocast(inputs.device.type, dtype=dtype):
        for _ in range(calls):
            _, records = record_ops(lambda: module(inputs))
            counts.append(sum(record.name in CAST_OPS for record in records))
    return counts
