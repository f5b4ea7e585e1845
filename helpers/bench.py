"""Benchmarks run live (06 §6-7), readers of data/benchmarks/ (written by ``python -m tools.bench``, which also
turns them into the README's tables)."""

import copy
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from . import peaks
from .device import tf32_flags
from .dtype_trace import OpObserver
from .measure import cuda_memory, time_it
from .model import DATA_DIR

BENCH_DIR = DATA_DIR / "benchmarks"
REPRODUCE = "python -m tools.bench"  # the recorder: course tooling, not installed
MODEL = "resnet50"
#: mode -> (dtype of the weights and inputs, autocast dtype or None): the one map of modes to
#: dtypes. "float32" is strict (TF32 off for matmuls and cuDNN), "tf32" turns both on.
MODES = {"float32": (torch.float32, None), "tf32": (torch.float32, None),
         "float16": (torch.float16, None), "bfloat16": (torch.bfloat16, None),
         "autocast_float16": (torch.float32, torch.float16),
         "autocast_bfloat16": (torch.float32, torch.bfloat16)}
INFERENCE_MODES = tuple(MODES)
GEMM_DTYPES = INFERENCE_MODES[:4]


def load_records(directory: str | Path = BENCH_DIR, device: str | None = None) -> list[dict]:
    """All recorded benchmark files (sorted by name), optionally only those of one device type."""
    records = [json.loads(path.read_text()) for path in sorted(Path(directory).glob("*.json"))]
    return [r for r in records if device is None or r["machine"]["device"] == device]


def absent_reason(mode: str, device: str | torch.device) -> str | None:
    """Why ``mode`` (GEMM dtype, inference or training) does not exist on ``device``, or None."""
    device = torch.device(device)
    major = torch.cuda.get_device_capability(device)[0] if device.type == "cuda" else None
    if "tf32" in mode and (major is None or major < 8):
        return f"no TF32 on {device.type}: a tensor-core mode of NVIDIA GPUs from Ampere (sm_80) on"
    if "bfloat16" in mode and major is not None and major < 8:
        return "no bf16 tensor cores before Ampere (sm_80)"
    return None


def mode_dtypes(mode: str) -> tuple[torch.dtype, torch.dtype | None]:
    """(dtype of the weights and inputs, autocast dtype or None) of ``mode``."""
    if mode not in MODES:
        raise ValueError(f"Unknown mode {mode!r}: use one of {', '.join(MODES)}.")
    return MODES[mode]


def peak_tensor_bytes(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``fn()``'s result and the peak bytes of tensor storage it made (stand-in for CUDA's peak)"""
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._pytree import tree_leaves
    def storages(values: Any) -> dict[int, torch.UntypedStorage]:
        return {s.data_ptr(): s for v in tree_leaves(values) if isinstance(v, torch.Tensor)
                for s in [v.untyped_storage()] if s.nbytes()}

    live: dict[int, tuple[StorageWeakRef, int]] = {}  # data_ptr -> (weak ref, bytes) made in fn
    peak = [0]

    def seen(func, args: tuple, kwargs: dict, out: Any) -> None:
        existing = storages((args, kwargs))
        live.update({k: (StorageWeakRef(s), s.nbytes()) for k, s in storages(out).items()
                     if k not in existing})
        for key in [key for key, (ref, _) in live.items() if ref.expired()]:
            del live[key]
        peak[0] = max(peak[0], sum(n for _, n in live.values()))

    with OpObserver(seen):
        result = fn()
    return result, peak[0]


def _measure(fn: Callable[[], Any], device: torch.device, label: str, mode: str,
             min_run_time: float, with_memory: bool = True) -> tuple[float, tuple | None]:
    """One warm-up call, then (median seconds, memory of one call); TF32 on only in 'tf32'."""
    with tf32_flags(mode == "tf32"):
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the warm-up (cudnn.benchmark's autotuning) ends first
        # weights, inputs made before: not this call's
        memory = (None if not with_memory else tuple(cuda_memory(fn, device))
                  if device.type == "cuda" else (peak_tensor_bytes(fn)[1], None))
        seconds = time_it(fn, label=label, sub_label=mode, min_run_time=min_run_time).median
    return seconds, memory


def gemm(dtype: str, n: int, device: str | torch.device = "cpu",
         min_run_time: float = 0.5) -> dict[str, Any]:
    """TFLOP/s of an n x n matmul in ``dtype``, peak and fraction of it; "absent": why not here."""
    device = torch.device(device)
    if dtype not in GEMM_DTYPES:
        raise ValueError(f"Unknown GEMM dtype {dtype!r}: use one of {', '.join(GEMM_DTYPES)}.")
    entry: dict[str, Any] = {"dtype": dtype, "n": n, "tflops": None, "seconds": None}
    if absent_reason(dtype, device):
        entry["absent"] = absent_reason(dtype, device)
    else:
        generator = torch.Generator(device).manual_seed(0)
        a, b = (torch.randn(n, n, device=device, generator=generator, dtype=MODES[dtype][0])
                for _ in range(2))
        seconds, _ = _measure(lambda: a @ b, device, "gemm", dtype, min_run_time, with_memory=False)
        entry.update(tflops=2 * n**3 / seconds / 1e12, seconds=seconds)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    peak = peaks.peak_tflops(name, dtype) if name else None
    share = None if peak is None or entry["tflops"] is None else entry["tflops"] / peak
    return {**entry, "peak_tflops": peak, "fraction_of_peak": share}


def prepare_model(model: nn.Module, mode: str, device: str | torch.device = "cpu") -> nn.Module:
    """A copy of fp32 ``model`` for inference in ``mode``: on ``device``, eval, channels_last."""
    return copy.deepcopy(model).to(device=device, dtype=mode_dtypes(mode)[0]).eval().to(
        memory_format=torch.channels_last)


def _images(batch: int, image_size: int, device: torch.device, dtype: torch.dtype):
    """Random channels_last images (seeded by the batch size) and the generator that made them."""
    generator = torch.Generator(device).manual_seed(batch)
    x = torch.randn(batch, 3, image_size, image_size, device=device, generator=generator)
    return x.to(dtype).contiguous(memory_format=torch.channels_last), generator


def forward_fn(net: nn.Module, x: torch.Tensor, mode: str = "float32") -> Callable[[], Any]:
    """A no-argument ``net(x)`` in ``mode``, own inference_mode and autocast per call (a request)"""
    amp_dtype = mode_dtypes(mode)[1]

    def forward() -> torch.Tensor:
        with torch.inference_mode(), tf32_flags(mode == "tf32"), torch.amp.autocast(
                x.device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            return net(x)
    return forward


def inference(net: nn.Module, mode: str, batch: int, *, image_size: int = 224,
              min_run_time: float = 0.5, model_name: str = MODEL) -> dict[str, Any]:
    """Latency, throughput and memory of ``net`` (:func:`prepare_model`) on random images."""
    device = next(net.parameters()).device
    forward = forward_fn(net, _images(batch, image_size, device, mode_dtypes(mode)[0])[0], mode)
    seconds, (memory, reserved) = _measure(forward, device, "inference", mode, min_run_time)
    return {"model": model_name, "dtype": mode, "batch": batch, "images_per_s": batch / seconds,
            "latency_ms": seconds * 1e3, "peak_memory_bytes": memory,
            "peak_reserved_bytes": reserved}


def inference_memory(net: nn.Module, mode: str, batch: int, *, image_size: int = 224) -> dict[str, Any]:
    """The memory of one request batch of ``net`` (:func:`prepare_model`) in ``mode``, untimed.

    CPU: the peak bytes of the tensors one call creates; CUDA: the allocator's peak above what was allocated
    before, and its reserved bytes. One warm-up call first.
    """
    device = next(net.parameters()).device
    images = _images(batch, image_size, device, mode_dtypes(mode)[0])[0]
    forward = forward_fn(net, images, mode)
    forward()
    if device.type == "cuda":
        memory, reserved = cuda_memory(forward, device)
    else:
        memory = peak_tensor_bytes(forward)[1]
        reserved = None
    return {"model": MODEL, "dtype": mode, "batch": batch, "peak_memory_bytes": memory,
            "peak_reserved_bytes": reserved}


def speedups(values: dict[str, float], lower_is_faster: bool = False) -> dict[str, dict]:
    """``{mode: {baseline: speed-up}}`` over "float32" (strict) and "tf32" in ``values``."""
    bases = [b for b in ("float32", "tf32") if b in values]
    return {m: {b: (values[b] / v if lower_is_faster else v / values[b]) for b in bases}
            for m, v in values.items() if m not in ("float32", "tf32")}


def plot_inference(records: Sequence[dict], ax=None, metric: str = "images_per_s"):
    """Plot an inference ``metric`` against batch size (log-log), one line per record and mode."""
    if ax is None:
        import matplotlib.pyplot as plt
        ax = plt.subplots(figsize=(6, 3.5), dpi=80)[1]
    for record in records:
        for mode in dict.fromkeys(e["dtype"] for e in record["inference"]):
            points = [(e["batch"], e[metric]) for e in record["inference"]
                      if e["dtype"] == mode and e.get(metric)]
            if points:
                ax.plot(*zip(*points), marker="o", label=f"{record['machine']['device']} · {mode}")
    ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel=metric.replace("_", " "),
           title=f"{MODEL}: inference")
    batches = sorted({e["batch"] for r in records for e in r["inference"]})
    ax.minorticks_off()
    ax.set_xticks(batches, [str(b) for b in batches])
    if ax.lines:
        ax.legend(fontsize=8)
    return ax
