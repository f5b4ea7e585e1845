"""Benchmarks run live (06 §6-7), readers of data/benchmarks/ (written by ``python -m tools.bench``, which also
turns them into the README's tables)."""

import copy
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .device import tf32_flags
from .dtype_trace import OpObserver
from .measure import cuda_memory
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
