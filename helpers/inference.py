"""Harnesses of notebook 01 (half-precision inference): dtype tables, activation bytes, forward timings, run
comparisons, GEMM throughput, autocast registrations and the datasheet-peak plot.

The notebook keeps the idea in its cells; the bookkeeping around each experiment lives here, tested in
``tests/test_inference.py``.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
from torch import nn

from .device import strict_fp32
from .measure import time_it
from .peaks import GpuPeak
from .train import EvalResult


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_kinds(module: nn.Module) -> dict[str, tuple[int, str]]:
    """``{kind: (how many tensors, their dtypes)}`` for the parameters and for each buffer name of ``module``."""
    table: dict[str, tuple[int, set[str]]] = {}
    for name, tensor in list(module.named_parameters()) + list(module.named_buffers()):
        kind = "parameter" if isinstance(tensor, nn.Parameter) else "buffer " + name.split(".")[-1]
        count, dtypes = table.get(kind, (0, set()))
        table[kind] = (count + 1, dtypes | {_dtype_name(tensor.dtype)})
    return {kind: (count, ", ".join(sorted(dtypes))) for kind, (count, dtypes) in table.items()}


def dtype_changes(before: nn.Module, after: nn.Module) -> dict[str, str]:
    """``{kind: "count x dtype -> dtype"}``: what a conversion such as ``.half()`` did to each kind of tensor."""
    old, new = dtype_kinds(before), dtype_kinds(after)
    return {kind: f"{count} x {dtypes} -> {new[kind][1]}" for kind, (count, dtypes) in old.items()}


def activation_bytes(module: nn.Module, inputs: torch.Tensor) -> tuple[int, int]:
    """(bytes of all leaf-module outputs, largest input + output bytes of one leaf module) in one forward pass.

    The first counts every byte the layers *write*; the second is about what is alive at the peak under
    ``inference_mode``, where nothing keeps an output once the next layer has read it.
    """
    written, largest = 0, 0

    def count(_module: nn.Module, module_inputs: tuple, output: torch.Tensor) -> None:
        nonlocal written, largest
        out_bytes = output.numel() * output.element_size()
        written += out_bytes
        largest = max(largest, out_bytes + sum(t.numel() * t.element_size() for t in module_inputs))

    hooks = [m.register_forward_hook(count) for m in module.modules() if not list(m.children())]
    try:
        with torch.inference_mode():
            module(inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return written, largest


def forward_fn(module: nn.Module, inputs: torch.Tensor,
               autocast_dtype: torch.dtype | None = None) -> Callable[[], torch.Tensor]:
    """A no-argument function running ``module(inputs)`` under ``inference_mode`` (and autocast if a dtype is
    given). float32 runs are strict float32 (TF32 off) on a GPU, so that a float32 baseline is float32."""
    device_type = inputs.device.type

    def run() -> torch.Tensor:
        precision = strict_fp32() if autocast_dtype is None else contextlib.nullcontext()
        with torch.inference_mode(), precision, torch.amp.autocast(
                device_type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            return module(inputs)
    return run


def forward_speedups(cases: dict[str, tuple], min_run_time: float = 0.1) -> dict[str, float]:
    """Speed of each forward pass relative to the first case (> 1: faster), timed with :func:`time_it`.

    ``cases``: ``{label: (module, inputs)}`` or ``{label: (module, inputs, autocast_dtype)}``; the first is the
    baseline. Rounded to 2 decimals: a timing is not more precise than that.
    """
    seconds = {label: time_it(forward_fn(*case), min_run_time=min_run_time).median for label, case in cases.items()}
    baseline = next(iter(seconds.values()))
    return {label: round(baseline / s, 2) for label, s in seconds.items()}


def subset(dataset: torch.utils.data.TensorDataset, n: int) -> torch.utils.data.TensorDataset:
    """The first ``n`` examples of a ``TensorDataset`` (all of it if it is shorter)."""
    return torch.utils.data.TensorDataset(*(t[:n] for t in dataset.tensors))


def compare_runs(runs: dict[str, EvalResult], reference: EvalResult,
                 labels: torch.Tensor) -> dict[str, dict[str, float]]:
    """Each run against ``reference`` on the images both saw (a run may cover only a prefix of the test set):
    ``{name: {"images", "accuracy", "drop", "agreement", "max_logit_diff"}}``; ``drop`` is the reference's
    accuracy on the same images minus the run's."""
    rows = {}
    for name, run in runs.items():
        n = len(run.predictions)
        reference_accuracy = (reference.predictions[:n] == labels[:n]).float().mean().item()
        rows[name] = {
            "images": n,
            "accuracy": run.accuracy,
            "drop": reference_accuracy - run.accuracy,
            "agreement": (run.predictions == reference.predictions[:n]).float().mean().item(),
            "max_logit_diff": (run.logits - reference.logits[:n]).abs().max().item(),
        }
    return rows


def format_comparison(rows: dict[str, dict[str, float]]) -> str:
    """A fixed-width text table of :func:`compare_runs`' rows."""
    lines = [f"{'run':<24}{'images':>7}{'accuracy':>10}{'drop':>8}{'agreement':>11}{'max |logit diff|':>18}"]
    for name, r in rows.items():
        lines.append(f"{name:<24}{r['images']:>7}{r['accuracy']:>10.2%}{r['drop']:>8.2%}{r['agreement']:>11.2%}"
                     f"{r['max_logit_diff']:>18.4f}")
    return "\n".join(lines)


def plot_logit_errors(runs: dict[str, EvalResult], reference: EvalResult, ax=None):
    """Histogram (log x axis) of |logit - float32 logit| for every run but the reference."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5), dpi=80)
    bins = torch.logspace(-6, 0, 40)
    for name, run in runs.items():
        if run is reference:
            continue
        diff = (run.logits - reference.logits[: len(run.logits)]).abs().flatten().clamp(min=1e-6)
        ax.hist(diff.numpy(), bins=bins.numpy(), histtype="step", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("|logit - float32 logit|")
    ax.set_ylabel("count of logits")
    ax.set_title("Logit error of each low-precision run")
    ax.legend(fontsize=8)
    return ax


def largest_activations(module: nn.Module, images: torch.Tensor, batch_size: int = 500) -> dict[str, float]:
    """The largest absolute output of every leaf module over ``images`` (float32 forward, inference mode)."""
    device = next(module.parameters()).device
    largest: dict[str, float] = {}

    def track(name: str) -> Callable:
        def hook(_module: nn.Module, _inputs: tuple, output: torch.Tensor) -> None:
            largest[name] = max(largest.get(name, 0.0), output.abs().max().item())
        return hook

    hooks = [m.register_forward_hook(track(n)) for n, m in module.named_modules() if not list(m.children())]
    try:
        with torch.inference_mode(), strict_fp32():
            for start in range(0, len(images), batch_size):
                module(images[start : start + batch_size].to(device))
    finally:
        for hook in hooks:
            hook.remove()
    return largest


def gemm_tflops(n: int, dtype: torch.dtype, device: str | torch.device, min_run_time: float = 0.2) -> float:
    """Measured TFLOP/s of an ``n x n`` matmul in ``dtype`` on ``device`` (2 n^3 operations per product).

    float32 is strict float32 (TF32 off), so it compares with the datasheet's FP32 figure, not TF32's.
    """
    generator = torch.Generator(device).manual_seed(0)
    a = torch.randn(n, n, device=device, generator=generator).to(dtype)
    b = torch.randn(n, n, device=device, generator=generator).to(dtype)
    with strict_fp32():
        seconds = time_it(lambda: a @ b, min_run_time=min_run_time).median
    return 2 * n**3 / seconds / 1e12


def peak_ratios(peaks: dict[str, GpuPeak], low: str = "bf16") -> dict[str, dict[str, float | None]]:
    """For each GPU, the dense 16-bit peak (``low``, falling back to fp16 where ``low`` has no tensor cores)
    divided by its fp32 and its tf32 peak: ``{gpu: {"format", "vs fp32", "vs tf32"}}`` (None: no TF32)."""
    ratios: dict[str, dict[str, Any]] = {}
    for name, gpu in peaks.items():
        fmt = low if gpu.tflops.get(low) else "fp16"
        top, tf32 = gpu.tflops[fmt], gpu.tflops.get("tf32")
        ratios[name] = {"format": fmt, "vs fp32": top / gpu.tflops["fp32"], "vs tf32": top / tf32 if tf32 else None}
    return ratios


def plot_peak_ratios(peaks: dict[str, GpuPeak], ax=None):
    """Bar chart of :func:`peak_ratios`: how many times the datasheet's 16-bit tensor-core peak exceeds the
    fp32 and the TF32 peak, per GPU (a missing bar: that GPU has no TF32)."""
    import matplotlib.pyplot as plt

    ratios = peak_ratios(peaks)
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.5), dpi=80)
    names = list(ratios)
    x = torch.arange(len(names)).numpy()
    vs_fp32 = [r["vs fp32"] for r in ratios.values()]
    vs_tf32 = [r["vs tf32"] or 0.0 for r in ratios.values()]
    ax.bar(x - 0.2, vs_fp32, width=0.4, label="16-bit peak / fp32 peak")
    ax.bar(x + 0.2, vs_tf32, width=0.4, label="16-bit peak / TF32 peak")
    ax.set_xticks(x, [f"{n}\n({r['format']})" for n, r in ratios.items()], fontsize=7)
    ax.set_ylabel("ratio of datasheet peaks")
    ax.set_title("Dense tensor-core 16-bit peak vs fp32 and TF32 (datasheets, data/gpu_peaks.json)")
    ax.legend(fontsize=8)
    return ax


def autocast_registrations(device: str = "CPU") -> set[str] | None:
    """Names of the ATen ops for which the installed PyTorch registers an autocast kernel on ``device``
    ("CPU" or "CUDA"), read from the dispatcher; ``None`` where that private API is missing or fails.

    The set is all of autocast's lists together (run in 16 bits, run in float32, promote to the widest input,
    banned): the dispatcher does not say which list an op is on.
    """
    get = getattr(torch._C, "_dispatch_get_registrations_for_dispatch_key", None)
    try:
        names = get(f"Autocast{device}") if get is not None else None
    except Exception:  # noqa: BLE001 - private API: absent, renamed, or changed
        return None
    return set(names) if names is not None else None


def cuda_forward_memory(cases: dict[str, tuple]) -> dict[str, dict[str, float]]:
    """The CUDA allocator's view of each forward pass in ``cases`` (as for :func:`forward_speedups`), in MiB:
    tensors the pass added at its peak (*allocated*), what the allocator had to reserve for it, and everything
    the allocator holds at that moment (weights and cached blocks included). Raises where there is no CUDA."""
    from .measure import cuda_memory

    mib = 2.0**20
    view = {}
    for label, case in cases.items():
        used = cuda_memory(forward_fn(*case), case[1].device)
        view[label] = {"allocated": round(used.call_allocated / mib, 2), "reserved": round(used.call_reserved / mib, 2),
                       "all reserved": round(used.peak_reserved / mib, 1)}
    return view
