"""Measurement: time (torch.utils.benchmark), parameter and activation bytes, CUDA memory."""
from __future__ import annotations

import logging
from typing import Any, Callable, NamedTuple

import torch
from torch import nn

# torch.utils.benchmark imports torch.utils.cpp_extension, which logs a warning on machines that have a CUDA
# toolkit but no GPU ("No CUDA runtime is found"). It is irrelevant to timing, so keep it out of notebooks.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
from torch.utils import benchmark  # noqa: E402


def time_it(fn: Callable[[], Any], *, label: str = "", sub_label: str = "", description: str = "",
            min_run_time: float = 0.5, blocks: int = 5) -> benchmark.Measurement:
    """Time ``fn()`` with ``torch.utils.benchmark.Timer``: about ``min_run_time`` seconds of calls, in blocks.

    A warm-up call and one timed call come first; that time sizes the blocks. A call slower than half of
    ``min_run_time`` is timed that once. Otherwise blocks of at least 20 calls each (each a ``Timer.timeit``, which
    warms up with two more calls; ``blocks`` of them where the calls fit) run until at least ``min_run_time``
    seconds of calls: a first call slower than the rest makes the blocks short, and then more of them run.
    Uses all of PyTorch's CPU threads (Timer's default is one) and lets Timer synchronise CUDA. Read ``.median``
    (seconds per call in the median block) or ``.times`` (one per block); printing the result shows the spread.

    (``Timer.blocked_autorange`` grows its block tenfold until one block alone takes ``min_run_time``; for calls
    well under a millisecond that costs up to about twenty times ``min_run_time``, and usually yields one block.)
    """
    timer = benchmark.Timer(
        stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads(),
        label=label, sub_label=sub_label, description=description,
    )
    first = timer.blocked_autorange(min_run_time=0)  # one warm-up call, then one timed call
    calls = int(min_run_time / first.times[0])  # how many calls fit in min_run_time
    if calls < 2:
        return first
    n_blocks = max(1, min(blocks, calls // 20))  # >= 20 calls a block: timeit's 2 warm-up calls stay under 10 %
    runs: list[benchmark.Measurement] = []
    while len(runs) < n_blocks or sum(run.raw_times[0] for run in runs) < min_run_time:
        runs.append(timer.timeit(number=calls // n_blocks))
    return benchmark.Measurement.merge(runs)[0]


def fastest_time(fn: Callable[[], Any], *, min_run_time: float = 0.5) -> float:
    """Seconds per call of ``fn()`` in the fastest block that :func:`time_it` timed.

    Other work on a busy machine can only slow a block down, so the fastest block is the best estimate of what the
    hardware does (a median mixes the disturbed blocks in). Use it for ratios between dtypes and sizes.
    """
    return min(time_it(fn, min_run_time=min_run_time).times)


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


class CudaMemory(NamedTuple):
    """What one call did to a CUDA device's memory, in bytes (see :func:`cuda_memory`).

    *Allocated* memory is what live tensors occupy; *reserved* memory is what PyTorch's caching allocator holds
    from the driver (allocated plus cached free blocks, rounded up to whole segments). An out-of-memory error is
    judged against reserved memory: a request fails when the allocator cannot reserve another segment, even if
    much of what it reserved is free but fragmented.
    """

    allocated_before: int  # live tensors before the call (weights, inputs, other models)
    reserved_before: int   # what the allocator held before the call (after emptying its cache, if asked)
    peak_allocated: int    # the allocator's peak of live tensors during the call (absolute)
    peak_reserved: int     # the allocator's peak of reserved memory during the call (absolute)

    @property
    def call_allocated(self) -> int:
        """Peak bytes of tensors the call added on top of what was allocated before it."""
        return self.peak_allocated - self.allocated_before

    @property
    def call_reserved(self) -> int:
        """Peak bytes the allocator had to reserve on top of what it held before the call."""
        return self.peak_reserved - self.reserved_before


def cuda_memory(fn: Callable[[], Any], device: str | torch.device = "cuda", *,
                empty_cache: bool = True) -> CudaMemory:
    """Run ``fn()`` once on a CUDA device and return its :class:`CudaMemory` (raises where there is no CUDA).

    ``empty_cache`` first returns the allocator's cached free blocks to the driver, so that ``reserved_before``
    is what live tensors need and ``call_reserved`` what this call made the allocator reserve.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("cuda_memory needs a CUDA GPU; on CPU use saved_activation_bytes instead.")
    torch.cuda.synchronize(device)
    if empty_cache:
        torch.cuda.empty_cache()
    allocated, reserved = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return CudaMemory(allocated, reserved, torch.cuda.max_memory_allocated(device),
                      torch.cuda.max_memory_reserved(device))


def peak_cuda_memory(fn: Callable[[], Any], device: str | torch.device = "cuda") -> int:
    """Peak bytes of CUDA tensors ``fn()`` allocates on top of those allocated before it (raises without CUDA).

    The allocator's peak minus what was allocated before the call, so weights and inputs that already exist
    do not count; it is *allocated* memory (live tensors), not *reserved* memory (what an out-of-memory error is
    judged against): :func:`cuda_memory` returns both.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("peak_cuda_memory needs a CUDA GPU; on CPU use saved_activation_bytes instead.")
    return cuda_memory(fn, device, empty_cache=False).call_allocated
