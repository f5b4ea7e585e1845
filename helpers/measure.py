"""Measurement (01): parameter bytes (§1), timing and CUDA memory (§4), saved bytes (§6)."""

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.utils import benchmark


def time_it(fn: Callable[[], Any], *, label: str = "", sub_label: str = "", description: str = "",
            min_run_time: float = 0.5, blocks: int = 5) -> benchmark.Measurement:
    """Time ``fn()`` with ``benchmark.Timer`` in blocks of >= 20 calls; read ``.median``; 01 §4."""
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads(),
                            label=label, sub_label=sub_label, description=description)
    first = timer.blocked_autorange(min_run_time=0)  # one warm-up call, then one timed call
    if 2 * first.times[0] > min_run_time:  # too slow for blocks, or a cold call (a busy core)
        again = timer.blocked_autorange(min_run_time=0)  # time it once more, keep the faster
        first = min(first, again, key=lambda m: m.times[0])
    calls = int(min_run_time / first.times[0])  # how many calls fit in min_run_time
    if calls < 2:
        return first
    n_blocks = max(1, min(blocks, calls // 20))  # >= 20 calls a block: timeit's 2 warm-ups < 10 %
    runs: list[benchmark.Measurement] = []
    while len(runs) < n_blocks or sum(run.raw_times[0] for run in runs) < min_run_time:
        runs.append(timer.timeit(number=calls // n_blocks))
    return benchmark.Measurement.merge(runs)[0]


def parameter_bytes(model: nn.Module, include_buffers: bool = True) -> int:
    """Bytes held by the model's parameters (and buffers, by default)."""
    tensors = list(model.parameters()) + (list(model.buffers()) if include_buffers else [])
    return sum(t.numel() * t.element_size() for t in tensors)


def saved_activation_bytes_by_dtype(fn: Callable[[], Any],
                                    exclude: nn.Module | None = None) -> dict[torch.dtype, int]:
    """Bytes autograd saves in ``fn()`` per dtype, largest first, parameters of ``exclude`` out."""
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
    """Total bytes autograd saves for backward while ``fn()`` runs (all dtypes)."""
    return sum(saved_activation_bytes_by_dtype(fn, exclude).values())


class CudaMemory(NamedTuple):
    """One call's CUDA memory: *allocated* (live tensors), *reserved* (held by the cache); 01 §4."""

    call_allocated: int  # peak bytes of tensors the call added on top of those allocated before it
    call_reserved: int  # peak bytes the allocator reserved on top of what it held before the call


def cuda_memory(fn: Callable[[], Any], device: str | torch.device = "cuda", *,
                empty_cache: bool = True) -> CudaMemory:
    """:class:`CudaMemory` of one ``fn()`` (raises without CUDA), after ``empty_cache`` if asked."""
    if not torch.cuda.is_available():
        raise RuntimeError("cuda_memory needs a CUDA GPU; on CPU use saved_activation_bytes.")
    torch.cuda.synchronize(device)
    if empty_cache:
        torch.cuda.empty_cache()
    allocated, reserved = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return CudaMemory(torch.cuda.max_memory_allocated(device) - allocated,
                      torch.cuda.max_memory_reserved(device) - reserved)
