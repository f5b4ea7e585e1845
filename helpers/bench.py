"""Benchmark measurements the notebooks run live, and readers of the recorded files in data/benchmarks/.

The recorder that writes those files is course tooling: ``python -m tools.bench`` (its docstring gives the
record format). Modes: "float32" is strict fp32 (TF32 off for matmuls and cuDNN); "tf32" turns both on;
"float16"/"bfloat16" convert the model and inputs; "autocast_*" run the fp32 model under ``torch.amp.autocast``.
"""
from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn

from .device import tf32_flags
from .measure import cuda_memory, time_it
from .peaks import GOOD_GEMM_FRACTION, peak_for
from .model import DATA_DIR

BENCH_DIR = DATA_DIR / "benchmarks"
REPRODUCE = "python -m tools.bench"  # the recorder: course tooling, not installed

GEMM_DTYPES = ("float32", "tf32", "float16", "bfloat16")
INFERENCE_MODES = ("float32", "tf32", "float16", "bfloat16", "autocast_float16", "autocast_bfloat16")
MODEL = "resnet50"
def load_records(directory: str | Path = BENCH_DIR, device: str | None = None) -> list[dict]:
    """All recorded benchmark files (sorted by name), optionally only those of one device type."""
    records = [json.loads(path.read_text()) for path in sorted(Path(directory).glob("*.json"))]
    return [r for r in records if device is None or r["machine"]["device"] == device]


def absent_reason(mode: str, device: str | torch.device) -> str | None:
    """Why ``mode`` (a GEMM dtype, inference or training mode) does not exist on ``device``; None when it does."""
    device = torch.device(device)
    major = torch.cuda.get_device_capability(device)[0] if device.type == "cuda" else None
    if "tf32" in mode and (major is None or major < 8):
        return f"no TF32 on {device.type}: it is a tensor-core mode of NVIDIA GPUs from Ampere (sm_80) on"
    if "bfloat16" in mode and major is not None and major < 8:
        return "no bf16 tensor cores before Ampere (sm_80)"
    return None


def parameter_dtype(mode: str) -> torch.dtype:
    """The dtype of the weights and inputs in ``mode``: fp16/bf16 for a converted model, else fp32."""
    if mode not in INFERENCE_MODES:
        raise ValueError(f"Unknown mode {mode!r}: use one of {', '.join(INFERENCE_MODES)}.")
    return {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(mode, torch.float32)


def autocast_context(mode: str, device_type: str) -> contextlib.AbstractContextManager:
    """``torch.amp.autocast`` for the autocast_* modes, a no-op context for the others."""
    if parameter_dtype(mode) == torch.float32 and mode.startswith("autocast_"):
        return torch.amp.autocast(device_type, dtype=getattr(torch, mode.removeprefix("autocast_")))
    return contextlib.nullcontext()


def peak_tensor_bytes(fn: Callable[[], Any]) -> tuple[Any, int]:
    """Run ``fn()``; return its result and the peak bytes of tensor storage created while it ran.

    Storage that existed before (weights, inputs) is not counted, nor are views and in-place results (they
    allocate nothing); a storage counts until it is freed. A device-independent stand-in for the CUDA allocator's
    peak, that does not see kernels' private scratch buffers.
    """
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    def storages(values: Any) -> dict[int, torch.UntypedStorage]:
        return {s.data_ptr(): s for v in tree_leaves(values) if isinstance(v, torch.Tensor)
                for s in [v.untyped_storage()] if s.nbytes()}

    live: dict[int, tuple[StorageWeakRef, int]] = {}  # data_ptr -> (weak ref, bytes) of storage made during fn
    peak = 0

    class Tracker(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            nonlocal peak
            out = func(*args, **(kwargs or {}))
            existing = storages((args, kwargs))
            live.update({k: (StorageWeakRef(s), s.nbytes()) for k, s in storages(out).items() if k not in existing})
            for key in [key for key, (ref, _) in live.items() if ref.expired()]:
                del live[key]
            peak = max(peak, sum(n for _, n in live.values()))
            return out

    with Tracker():
        result = fn()
    return result, peak


def call_memory(fn: Callable[[], Any], device: str | torch.device) -> tuple[int, int | None]:
    """One call of ``fn()``: (peak bytes allocated on top of what was allocated before, the same for reserved
    bytes on CUDA, else None); see "peak_memory_bytes" and "peak_reserved_bytes"."""
    if torch.device(device).type != "cuda":
        return peak_tensor_bytes(fn)[1], None
    memory = cuda_memory(fn, device)  # weights, inputs, other models allocated before: not this call's
    return memory.call_allocated, memory.call_reserved


def _measure(fn: Callable[[], Any], device: torch.device, label: str, mode: str, min_run_time: float,
             with_memory: bool = True) -> tuple[float, tuple[int, int | None] | None]:
    """One warm-up call, then (median seconds, :func:`call_memory` of one call), TF32 on only in 'tf32' modes."""
    with tf32_flags(mode == "tf32"):
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the warm-up (and cudnn.benchmark's autotuning) ends before timing
        memory = call_memory(fn, device) if with_memory else None
        seconds = time_it(fn, label=label, sub_label=mode, min_run_time=min_run_time).median
    return seconds, memory


def gemm(dtype: str, n: int, device: str | torch.device = "cpu", min_run_time: float = 0.5) -> dict[str, Any]:
    """TFLOP/s of an n x n @ n x n matmul in ``dtype`` (one of GEMM_DTYPES); absent (null) where it does not exist."""
    device = torch.device(device)
    if dtype not in GEMM_DTYPES:
        raise ValueError(f"Unknown GEMM dtype {dtype!r}: use one of {', '.join(GEMM_DTYPES)}.")
    if absent_reason(dtype, device):
        return {"dtype": dtype, "n": n, "tflops": None, "seconds": None, "absent": absent_reason(dtype, device),
                **_of_peak(None, dtype, device)}
    generator = torch.Generator(device).manual_seed(0)
    torch_dtype = torch.float32 if dtype == "tf32" else getattr(torch, dtype)  # TF32 is a mode of fp32 matmuls
    a, b = (torch.randn(n, n, device=device, generator=generator, dtype=torch_dtype) for _ in range(2))
    seconds, _ = _measure(lambda: a @ b, device, "gemm", dtype, min_run_time, with_memory=False)
    tflops = 2 * n**3 / seconds / 1e12
    return {"dtype": dtype, "n": n, "tflops": tflops, "seconds": seconds, **_of_peak(tflops, dtype, device)}


def _of_peak(tflops: float | None, dtype: str, device: torch.device) -> dict[str, float | None]:
    """{"peak_tflops", "fraction_of_peak"} for a known GPU (data/gpu_peaks.json), else both None."""
    gpu = peak_for(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    peak = gpu.tflops.get(_PEAK_KEYS[dtype]) if gpu else None
    return {"peak_tflops": peak, "fraction_of_peak": None if peak is None or tflops is None else tflops / peak}


_PEAK_KEYS = {"float32": "fp32", "tf32": "tf32", "float16": "fp16", "bfloat16": "bf16"}


def prepare_model(model: nn.Module, mode: str, device: str | torch.device = "cpu") -> nn.Module:
    """A copy of fp32 ``model`` for inference in ``mode``: on ``device``, converted, eval mode, channels_last."""
    return copy.deepcopy(model).to(device=device, dtype=parameter_dtype(mode)).eval().to(
        memory_format=torch.channels_last)


def _images(batch: int, image_size: int, device: torch.device, dtype: torch.dtype):
    """Random channels_last images (seeded by the batch size) and the generator that made them."""
    generator = torch.Generator(device).manual_seed(batch)
    x = torch.randn(batch, 3, image_size, image_size, device=device, generator=generator)
    return x.to(dtype).contiguous(memory_format=torch.channels_last), generator


def inference(net: nn.Module, mode: str, batch: int, *, image_size: int = 224, min_run_time: float = 0.5,
              model_name: str = MODEL) -> dict[str, Any]:
    """Latency, throughput and memory of ``net`` (from :func:`prepare_model`) on a batch of random images."""
    device = next(net.parameters()).device
    x, _ = _images(batch, image_size, device, parameter_dtype(mode))

    def forward() -> torch.Tensor:
        with torch.inference_mode(), autocast_context(mode, device.type):
            return net(x)

    seconds, (memory, reserved) = _measure(forward, device, "inference", mode, min_run_time)
    return {"model": model_name, "dtype": mode, "batch": batch, "images_per_s": batch / seconds,
            "latency_ms": seconds * 1e3, "peak_memory_bytes": memory, "peak_reserved_bytes": reserved}


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "absent"
    return f"{value:.0f}" if abs(value) >= 10 ** digits else f"{value:.{digits}g}"


def results_markdown(records: Sequence[dict]) -> str:
    """The README's ``## Results`` section, generated from ``records`` (print it with ``--readme``)."""
    lines = ["## Results", "",
             f"Recorded with `{REPRODUCE}` (files in `data/benchmarks/`, format in `helpers/bench.py`); this "
             f"section is generated by `{REPRODUCE} --readme`. Random-weight ResNet-50 (`weights=None`), "
             "channels_last, inputs of random images; times are medians from `torch.utils.benchmark` after a "
             "warm-up call. `float32` is strict fp32 (TF32 off, also for cuDNN, whose PyTorch default is TF32 on); "
             "`tf32` (NVIDIA GPUs from Ampere on) is measured as its own mode. Peak memory is what one call "
             "allocates on top of the weights, inputs and optimizer state already in memory: on a GPU the CUDA "
             "allocator's peak minus what was allocated before (cuDNN workspaces included), on a CPU the peak of "
             "the tensors the call creates."]
    if not any(r["machine"]["device"] == "cuda" for r in records):
        lines += ["", f"**No GPU results are recorded yet.** On a CUDA machine, run `{REPRODUCE}` and commit the "
                  "file it writes to `data/benchmarks/`; notebooks 01, 03 and 06 and this section pick it up."]
    for record in records:
        machine, version = record["machine"], record["versions"]
        what = machine["device_name"] + (f" (sm {machine['gpu_capability']})" if machine["gpu_capability"] else
                                         f", {machine['threads']} threads")
        lines += ["", f"### {machine['device']} · {what} · torch {version['torch']} · {record['created'][:10]}", ""]
        if record["settings"].get("note"):
            lines += [f"Note: {record['settings']['note']}", ""]
        gpu = peak_for(machine["device_name"]) if machine["device"] == "cuda" else None
        if gpu is None:
            lines += ["Large GEMM (n x n @ n x n):", "", "| dtype | n | TFLOP/s |", "|---|---|---|"]
            lines += [f"| {e['dtype']} | {e['n']} | {_fmt(e['tflops'])} |" for e in record["gemm"]]
        else:
            lines += [f"Large GEMM (n x n @ n x n), as a fraction of the {gpu.name}'s dense datasheet peak "
                      f"(`data/gpu_peaks.json`; a good large GEMM reaches about {GOOD_GEMM_FRACTION:.0%}):", "",
                      "| dtype | n | TFLOP/s | peak TFLOP/s | fraction of peak |", "|---|---|---|---|---|"]
            for e in record["gemm"]:
                peak = gpu.tflops[_PEAK_KEYS[e["dtype"]]]
                fraction = None if peak is None or e["tflops"] is None else e["tflops"] / peak
                shown = ["-" if peak is None else f"{peak:g}", "-" if fraction is None else f"{fraction:.2f}"]
                lines.append(f"| {e['dtype']} | {e['n']} | {_fmt(e['tflops'])} | {shown[0]} | {shown[1]} |")
        batches = sorted({e["batch"] for e in record["inference"]})
        table = {(e["dtype"], e["batch"]): e["images_per_s"] for e in record["inference"]}
        lines += ["", f"{record['settings']['model']} inference, images/s by batch size "
                  "(\"-\": not measured at that size):", "",
                  "| mode | " + " | ".join(str(b) for b in batches) + " |", "|---" * (len(batches) + 1) + "|"]
        lines += [f"| {m} | " + " | ".join(_fmt(table[m, b]) if (m, b) in table else "-" for b in batches) + " |"
                  for m in dict.fromkeys(e["dtype"] for e in record["inference"])]
        lines += ["", "Training step (SGD, cross-entropy):", "",
                  "| mode | batch | step ms | peak memory MB |", "|---|---|---|---|"]
        for e in record["train_step"]:
            peak = e.get("peak_memory_bytes") or e.get("peak_tensor_bytes")  # older CPU records: peak_tensor_bytes
            lines.append(f"| {e['mode']} | {e['batch']} | {_fmt(e['step_ms'])} | "
                         f"{'-' if peak is None else _fmt(peak / 1e6)} |")
        for e in record["train_step"]:
            if e.get("scaler"):
                scaler = e["scaler"]
                lines += ["", f"{e['mode']}: the GradScaler skipped {scaler['skipped_steps']} of {scaler['steps']} "
                          f"steps (scale {scaler['init_scale']:g} -> {scaler['final_scale']:g})."]
    return "\n".join(lines) + "\n"


def plot_inference(records: Sequence[dict], ax=None, metric: str = "images_per_s"):
    """Plot an inference ``metric`` against batch size (log-log), one line per record and mode; ``records`` may be
    dicts with just "machine" and "inference" (e.g. entries measured live)."""
    if ax is None:
        import matplotlib.pyplot as plt

        ax = plt.subplots(figsize=(6, 3.5), dpi=80)[1]
    for record in records:
        for mode in dict.fromkeys(e["dtype"] for e in record["inference"]):
            points = [(e["batch"], e[metric]) for e in record["inference"] if e["dtype"] == mode and e.get(metric)]
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


