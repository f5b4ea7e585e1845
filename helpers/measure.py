"""Measurement: time (torch.utils.benchmark), parameter bytes, activation bytes, peak CUDA memory."""
from __future__ import annotations

import logging
from typing import Any, Callable

import torch
from torch import nn

# torch.utils.benchmark imports torch.utils.cpp_extension, which logs a warning on machines that have a CUDA
# toolkit but no GPU ("No CUDA runtime is found"). It is irrelevant to timing, so keep it out of notebooks.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
from torch.utils import benchmark  # noqa: E402


def time_it(fn: Callable[[], Any], *, label: str = "", sub_label: str = "", description: str = "",
            min_run_time: float = 0.5) -> benchmark.Measurement:
    """Time ``fn()`` with ``torch.utils.benchmark.Timer``.

    Uses all of PyTorch's CPU threads (Timer's default is one) and lets Timer synchronise CUDA.
    Read ``.median`` (seconds) from the result; printing it shows the spread too.
    """
    timer = benchmark.Timer(
        stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads(),
        label=label, sub_label=sub_label, description=description,
    )
    return timer.blocked_autorange(min_run_time=min_run_time)


def parameter_bytes(model: nn.Module, include_buffers: bool = True) -> int:
    """Bytes held by the model's parameters (and buffers, by default)."""
    tensors = list(model.parameters()) + (list(model.buffers()) if include_buffers else [])
    return sum(t.numel() * t.element_size() for t in tensors)


def saved_activation_bytes_by_dtype(fn: Callable[[], Any],
                                    exclude: nn.Module | None = None) -> dict[torch.dtype, int]:
    """Bytes of the tensors autograd saves for backward while ``fn()`` runs, per dtype, largest first.

    Each tensor counts once; a saved view of a larger tensor (e.g. a batch sliced from a dataset) counts only
    its own elements. Tensors that are parameters of ``exclude`` (e.g. the model) are left out, so the figures
    are the activation memory a training step holds between forward and backward. The split shows what
    autocast shrinks (16-bit activations) and what it does not (e.g. int64 max-pooling indices).
    """
    skip = {p.data_ptr() for p in exclude.parameters()} if exclude is not None else set()
    seen: dict[tuple, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.data_ptr() not in skip:
            key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()))
            seen[key] = tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn()
    totals: dict[torch.dtype, int] = {}
    for (_, dtype, _, _), nbytes in seen.items():
        totals[dtype] = totals.get(dtype, 0) + nbytes
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def saved_activation_bytes(fn: Callable[[], Any], exclude: nn.Module | None = None) -> int:
    """Total bytes autograd saves for backward while ``fn()`` runs (see :func:`saved_activation_bytes_by_dtype`)."""
    return sum(saved_activation_bytes_by_dtype(fn, exclude).values())


def peak_cuda_memory(fn: Callable[[], Any], device: str | torch.device = "cuda") -> int:
    """Peak bytes allocated on a CUDA device while ``fn()`` runs (raises where there is no CUDA)."""
    if not torch.cuda.is_available():
        raise RuntimeError("peak_cuda_memory needs a CUDA GPU; on CPU use saved_activation_bytes instead.")
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device)
