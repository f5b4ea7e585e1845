"""The dtype of every ATen op a piece of code runs (below autocast: casts visible); 02 §3."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


class OpObserver(TorchDispatchMode):
    """Calls ``seen(func, args, kwargs, out)`` after each ATen op run inside it (mode off there)."""

    def __init__(self, seen: Callable[[Any, tuple, dict, Any], None]) -> None:
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.seen(func, args, kwargs or {}, out)
        return out


def record_ops(fn: Callable[[], Any]) -> tuple[Any, list[OpRecord]]:
    """``fn()``'s result and the ATen ops it ran, in order, backward too (casts: ``_to_copy``)."""
    records: list[OpRecord] = []
    with OpObserver(lambda func, args, kwargs, out: records.append(OpRecord(
            func.overloadpacket.__name__, _float_dtypes((args, kwargs)), _float_dtypes(out)))):
        result = fn()
    return result, records
