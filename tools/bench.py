"""Benchmark recorder (course tooling): ``python -m tools.bench`` measures this machine, writes data/benchmarks/*.json.

Record format (one JSON file per machine and device; "schema": 1):

    {"schema": 1, "created": ISO time, "command": the command line that produced it,
     "machine": {"device": "cpu" | "cuda", "device_name": str, "threads": int, "gpu_capability": "9.0" | null,
                 "datasheet": {"name": str, "source": str} | null (a GPU of data/gpu_peaks.json)},
     "versions": {"torch": str, "torchvision": str, "python": str, "cuda": str | null, "cudnn": int | null},
     "settings": {...: what was measured and how, what was left out and why, a free-text "note"},
     "gemm": [{"dtype": "float32" | "tf32" | "float16" | "bfloat16", "n": int, "tflops": float | null,
               "seconds": float | null, "absent": "<why>" (only where the dtype does not exist on the device),
               "peak_tflops": float | null, "fraction_of_peak": float | null (known GPUs: datasheet dense peak)}],
     "inference": [{"model": "resnet50", "dtype": one of INFERENCE_MODES, "batch": int, "images_per_s": float,
                    "latency_ms": float, "peak_memory_bytes": int, "peak_reserved_bytes": int | null}],
     "train_step": [{"model": str, "mode": one of TRAIN_MODES, "batch": int, "step_ms": float,
                     "peak_memory_bytes": int, "peak_reserved_bytes": int | null,
                     "scaler": null | {"steps": int, "skipped_steps": int, "init_scale": float,
                                       "final_scale": float} (autocast_float16: what the GradScaler did)}]}

Modes. "float32" is strict fp32: TF32 off for matmuls and cuDNN (whose PyTorch default is TF32 on); "tf32"
(CUDA from Ampere on) turns both on; every other mode runs with TF32 off. "float16"/"bfloat16": ``model.half()``/
``.bfloat16()`` and inputs of that dtype; "autocast_*": the fp32 model under ``torch.amp.autocast``. Inference:
eval mode, ``torch.inference_mode()``, channels_last. Training step: SGD on cross-entropy, a ``GradScaler`` for
autocast_float16. Each measurement makes one warm-up call, then one call for memory, then ``helpers.time_it``.

"peak_memory_bytes": what one call allocates at its peak on top of what existed before it (weights, inputs,
optimizer state): on CUDA the allocator's peak minus what was allocated before (cuDNN workspaces included),
elsewhere the peak of the tensors the call creates (:func:`peak_tensor_bytes`; kernels' scratch buffers unseen).
"peak_reserved_bytes" (CUDA only): what the caching allocator had to *reserve* from the driver on top of what it
held before the call (its cache emptied first). Out of memory is not judged against either: a request the cache
cannot serve makes the allocator free its cached blocks and ask the driver again, and the error comes when that
fails against the device's free memory (other processes and the CUDA context take their share).

"scaler": a ``GradScaler`` starts at scale 2**16; where the fp16 loss gradient overflows at that scale (small
batches: the per-example gradients of the loss are larger), the first steps are *skipped* (no weight update)
and the scale halves each time. The timed steps include them; "skipped_steps" says how many there were.

Speed-ups of AMP name their baseline: where "tf32" exists (GPUs from Ampere on), ``--readme`` and the summary
printed after a run give each mode against strict fp32 *and* TF32 (a user's default float32 convolution there is
TF32), via :func:`speedups`.

Reading: ``helpers.bench.load_records`` and ``plot_inference``; the README's tables: :func:`results_markdown` here
(``--readme``).
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import platform
import re
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from helpers import peaks
from helpers.bench import (
    BENCH_DIR,
    INFERENCE_MODES,
    MODEL,
    MODES,
    REPRODUCE,
    _images,
    absent_reason,
    forward_fn,
    load_records,
    mode_dtypes,
    peak_tensor_bytes,
    prepare_model,
)
from helpers.device import cpu_flags, tf32_flags
from helpers.measure import cuda_memory, time_it
from helpers.peaks import peak_for
from helpers.training import amp_step

GEMM_DTYPES = INFERENCE_MODES[:4]


# --- what the recorder measures (only this tool runs it) ---------------------------------------------------

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


def inference(net: nn.Module, mode: str, batch: int, *, image_size: int = 224,
              min_run_time: float = 0.5, model_name: str = MODEL) -> dict[str, Any]:
    """Latency, throughput and memory of ``net`` (:func:`prepare_model`) on random images."""
    device = next(net.parameters()).device
    forward = forward_fn(net, _images(batch, image_size, device, mode_dtypes(mode)[0])[0], mode)
    seconds, (memory, reserved) = _measure(forward, device, "inference", mode, min_run_time)
    return {"model": model_name, "dtype": mode, "batch": batch, "images_per_s": batch / seconds,
            "latency_ms": seconds * 1e3, "peak_memory_bytes": memory,
            "peak_reserved_bytes": reserved}


def speedups(values: dict[str, float], lower_is_faster: bool = False) -> dict[str, dict]:
    """``{mode: {baseline: speed-up}}`` over "float32" (strict) and "tf32" in ``values``."""
    bases = [b for b in ("float32", "tf32") if b in values]
    return {m: {b: (values[b] / v if lower_is_faster else v / values[b]) for b in bases}
            for m, v in values.items() if m not in ("float32", "tf32")}


TRAIN_MODES = ("float32", "tf32", "autocast_float16", "autocast_bfloat16")
INIT_SCALE = 2.0**16  # GradScaler's default initial scale, spelled out so the record can state it


def plan(device_type: str, quick: bool = False) -> dict[str, Any]:
    """The sizes measured on ``device_type`` ('cpu' or 'cuda'); ``quick``: tiny sizes for a smoke test. fp16 is
    emulated on most CPUs (30-500x slower): there, fp16 inference runs at two batch sizes and fp16 training not."""
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"The recorder measures 'cpu' or 'cuda', not {device_type!r}.")
    gemm_n, batches, image_size, train_batch, min_run_time = {
        "quick": (64, [1, 2], 32, 2, 0.01), "cuda": (8192, [1, 8, 32, 128], 224, 32, 0.5),
        "cpu": (1024, [1, 8, 32], 224, 8, 0.5)}["quick" if quick else device_type]
    inference_batches = {mode: list(batches) for mode in INFERENCE_MODES}
    train_modes, left_out = list(TRAIN_MODES), {}
    if device_type == "cpu":
        for mode in ("float16", "autocast_float16"):
            inference_batches[mode] = batches[:2]
        left_out["float16 inference"] = f"batches {batches[:2]} only: fp16 is emulated on most CPUs, very slow"
        train_modes.remove("autocast_float16")
        left_out["train autocast_float16"] = "fp16 is emulated on most CPUs: a training step would take minutes"
    return {"quick": quick, "model": MODEL, "image_size": image_size, "channels_last": True,
            "cudnn_benchmark": device_type == "cuda", "gemm_n": gemm_n, "inference_batches": inference_batches,
            "train_batch": train_batch, "train_modes": train_modes,
            "train_optimizer": "SGD(lr=0.01, momentum=0.9); cross-entropy on random labels",
            "float32": "strict fp32: TF32 off for matmul and cuDNN; 'tf32' is measured as its own mode",
            "min_run_time_s": min_run_time, "left_out": left_out}


# What a CUDA run costs besides min_run_time, for planning (H100-class GPU; seconds; see estimated_seconds).
CUDA_COSTS = {
    "startup": 15.0,       # CUDA context, cuDNN/cuBLAS handles, building ResNet-50, the first copies to the GPU
    "per_measurement": 0.8,  # the warm-up and memory calls, time_it's sizing call and each block's 2 warm-up
                             # calls, a last block past min_run_time; generous: not yet checked on a GPU
    "autotune_inference": 2.0,  # cudnn.benchmark tries every algorithm of ResNet-50's ~20 conv shapes, once per
                                # (mode, batch): a new dtype, batch or TF32 flag is a new shape to it
    "autotune_train": 6.0,      # the same for forward + both backward convolutions
}


def measurement_counts(settings: dict[str, Any], device: str | torch.device = "cpu") -> dict[str, int]:
    """How many GEMMs, inference and training measurements ``settings`` (from :func:`plan`) makes on ``device``."""
    present = [m for m in INFERENCE_MODES if absent_reason(m, device) is None]
    return {"gemm": sum(absent_reason(d, device) is None for d in GEMM_DTYPES),
            "inference": sum(len(settings["inference_batches"][m]) for m in present),
            "train": sum(absent_reason(m, device) is None for m in settings["train_modes"])}


def estimated_seconds(settings: dict[str, Any], device: str | torch.device = "cuda") -> float:
    """The recorder's wall time with ``settings`` on a CUDA ``device``, from the plan and :data:`CUDA_COSTS`.

    Each measurement: ``min_run_time`` + the per-measurement overhead; each inference or training configuration
    also pays cuDNN's autotuning once; plus start-up. A planning figure, checked by a real run's "wall_seconds".
    """
    counts, costs = measurement_counts(settings, device), CUDA_COSTS
    per_measurement = settings["min_run_time_s"] + costs["per_measurement"]
    return (costs["startup"] + sum(counts.values()) * per_measurement
            + counts["inference"] * costs["autotune_inference"] + counts["train"] * costs["autotune_train"])


def train_step(model: nn.Module, mode: str, batch: int, *, device: str | torch.device = "cpu",
               image_size: int = 224, min_run_time: float = 0.5, model_name: str = MODEL,
               num_classes: int = 1000) -> dict[str, Any]:
    """Time and memory of one SGD step of a copy of fp32 ``model`` in ``mode`` (one of TRAIN_MODES). The step ends
    with ``zero_grad(set_to_none=True)``: between calls only the weights and the optimizer state remain."""
    if mode not in TRAIN_MODES:
        raise ValueError(f"Unknown training mode {mode!r}: use one of {', '.join(TRAIN_MODES)}.")
    device = torch.device(device)
    net = copy.deepcopy(model).to(device, memory_format=torch.channels_last).train()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, init_scale=INIT_SCALE) if mode == "autocast_float16" else None
    amp_dtype = mode_dtypes(mode)[1]
    x, generator = _images(batch, image_size, device, torch.float32)
    y = torch.randint(0, num_classes, (batch,), device=device, generator=generator)

    counts = {"steps": 0, "applied": 0}  # GradScaler.step skips optimizer.step() when a gradient overflowed
    optimizer.register_step_post_hook(lambda *args: counts.__setitem__("applied", counts["applied"] + 1))

    def step() -> None:
        counts["steps"] += 1
        amp_step(net, x, y, optimizer, amp_dtype=amp_dtype, scaler=scaler)
        optimizer.zero_grad(set_to_none=True)

    seconds, (memory, reserved) = _measure(step, device, "train step", mode, min_run_time)
    scaling = None if scaler is None else {
        "steps": counts["steps"], "skipped_steps": counts["steps"] - counts["applied"],
        "init_scale": INIT_SCALE,
        "final_scale": float(scaler.get_scale())}
    return {"model": model_name, "mode": mode, "batch": batch, "step_ms": seconds * 1e3, "peak_memory_bytes": memory,
            "peak_reserved_bytes": reserved, "scaler": scaling}


def machine_info(device: torch.device) -> dict[str, Any]:
    """Device type and name, PyTorch's CPU thread count, the GPU's compute capability and datasheet entry."""
    cpuinfo, cuda = Path("/proc/cpuinfo"), device.type == "cuda"
    names = re.findall(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), flags=re.M) if cpuinfo.exists() else []
    cpu_name = names[0].strip() if names else platform.processor() or platform.machine()
    gpu = peak_for(torch.cuda.get_device_name(device)) if cuda else None
    return {"device": device.type, "device_name": torch.cuda.get_device_name(device) if cuda else cpu_name,
            "threads": torch.get_num_threads(),
            "gpu_capability": "%d.%d" % torch.cuda.get_device_capability(device) if cuda else None,
            "datasheet": {"name": gpu.name, "source": gpu.source} if gpu else None}


def measure(device: str | torch.device | None = None, quick: bool = False, note: str = "",
            command: str = REPRODUCE, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure GEMMs, the inference sweep and the training step on ``device`` (default: cuda if any, else cpu)."""
    import torchvision

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("No CUDA device is available here: record this machine with --device cpu.")
    absent = {m: absent_reason(m, device) for m in INFERENCE_MODES + TRAIN_MODES if absent_reason(m, device)}
    flags = None if device.type == "cuda" else sorted({"avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16"}
                                                      & cpu_flags())  # the CPU's native 16-bit instructions
    settings = {**plan(device.type, quick), "absent": absent, "note": note, "cpu_16bit_flags": flags}
    if device.type == "cuda":
        settings["estimated_seconds"] = round(estimated_seconds(settings, device))
    versions = {"torch": torch.__version__, "torchvision": torchvision.__version__, "python": platform.python_version(),
                "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None}
    record: dict[str, Any] = {"schema": 1, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), "command": command, "machine": machine_info(device), "versions": versions,
        "settings": settings, "gemm": [], "inference": [], "train_step": []}
    start, saved_benchmark = time.perf_counter(), torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = settings["cudnn_benchmark"]
    run_time, sizes = settings["min_run_time_s"], {"image_size": settings["image_size"], "model_name": MODEL}
    try:
        for dtype in GEMM_DTYPES:
            record["gemm"].append(gemm(dtype, settings["gemm_n"], device, run_time))
            progress(f"gemm {record['gemm'][-1]}")
        torch.manual_seed(0)
        model = torchvision.models.get_model(MODEL, weights=None)  # random weights: nothing is downloaded
        for mode, batches in settings["inference_batches"].items():
            if mode not in absent:
                net = prepare_model(model, mode, device)
                for batch in batches:
                    record["inference"].append(inference(net, mode, batch, min_run_time=run_time, **sizes))
                    progress(f"inference {record['inference'][-1]}")
        for mode in [m for m in settings["train_modes"] if m not in absent]:
            record["train_step"].append(train_step(model, mode, settings["train_batch"], device=device,
                                                   min_run_time=run_time, **sizes))
            progress(f"train step {record['train_step'][-1]}")
    finally:
        torch.backends.cudnn.benchmark = saved_benchmark
    settings["wall_seconds"] = round(time.perf_counter() - start, 1)
    return record


def save_record(record: dict, directory: str | Path = BENCH_DIR) -> Path:
    """Write ``record`` to ``<device>_<device name>.json`` in ``directory`` (one file per machine and device: a
    re-run replaces it); return the path."""
    machine = record["machine"]
    slug = re.sub(r"[^a-z0-9]+", "-", machine["device_name"].lower()).strip("-") or "unknown"
    path = Path(directory) / f"{machine['device']}_{slug}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


# --- the README's Results section, generated from the records (``--readme``) ---------------------------

def _speedup_line(what: str, values: dict[str, float], lower_is_faster: bool = False) -> list[str]:
    if "tf32" not in values:  # CPUs and GPUs before Ampere: strict fp32 is the only float32
        return []
    parts = [f"{m} {r['float32']:.2f}x strict fp32, {r['tf32']:.2f}x TF32"
             for m, r in speedups(values, lower_is_faster).items()]
    return ["", f"{what}, speed-up over each float32 baseline: " + "; ".join(parts) + "."]


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "absent"
    return f"{value:.0f}" if abs(value) >= 10 ** digits else f"{value:.{digits}g}"


_INTRO = (
    f"Recorded with `{REPRODUCE}` (files in `data/benchmarks/`, format in `tools/bench.py`); this "
    f"section is generated by `{REPRODUCE} --readme`. Random-weight ResNet-50 (`weights=None`), "
    "channels_last, inputs of random images; times are medians from `torch.utils.benchmark` "
    "after a warm-up call. `float32` is strict fp32 (TF32 off, also for cuDNN, whose PyTorch "
    "default is TF32 on); `tf32` (NVIDIA GPUs from Ampere on) is measured as its own mode. Peak "
    "memory is what one call allocates on top of the weights, inputs and optimizer state already "
    "in memory: on a GPU the CUDA allocator's peak minus what was allocated before (cuDNN "
    "workspaces included), on a CPU the peak of the tensors the call creates.")


def _gemm_markdown(record: dict) -> list[str]:
    name = record["machine"]["device_name"]
    gpu = peaks.peak_for(name) if record["machine"]["device"] == "cuda" else None
    if gpu is None:
        return ["Large GEMM (n x n @ n x n):", "", "| dtype | n | TFLOP/s |", "|---|---|---|"] + [
            f"| {e['dtype']} | {e['n']} | {_fmt(e['tflops'])} |" for e in record["gemm"]]
    lines = [f"Large GEMM (n x n @ n x n), as a fraction of the {gpu.name}'s dense datasheet peak "
             f"(`data/gpu_peaks.json`; a good large GEMM reaches about "
             f"{peaks.GOOD_GEMM_FRACTION:.0%}):", "",
             "| dtype | n | TFLOP/s | peak TFLOP/s | fraction of peak |", "|---|---|---|---|---|"]
    for e in record["gemm"]:
        peak = peaks.peak_tflops(name, e["dtype"])
        share = peaks.fraction_of_peak(e["tflops"], name, e["dtype"])
        peak, share = "-" if peak is None else f"{peak:g}", "-" if share is None else f"{share:.2f}"
        lines.append(f"| {e['dtype']} | {e['n']} | {_fmt(e['tflops'])} | {peak} | {share} |")
    return lines


def results_markdown(records: Sequence[dict]) -> str:
    """The README's ``## Results`` section, generated from ``records`` (``--readme`` prints it)."""
    lines = ["## Results", "", _INTRO]
    if not any(r["machine"]["device"] == "cuda" for r in records):
        lines += ["", "**No GPU results are recorded yet.** On a CUDA machine, run "
                  f"`{REPRODUCE}` and commit the file it writes to `data/benchmarks/`; notebooks "
                  "01, 03 and 06 and this section pick it up."]
    for record in records:
        machine, version = record["machine"], record["versions"]
        # which CPU made the figure: its 16-bit units
        flags = record["settings"].get("cpu_16bit_flags")
        what = machine["device_name"] + (
            f" (sm {machine['gpu_capability']})" if machine["gpu_capability"] else
            f", {machine['threads']} threads, 16-bit CPU flags: {', '.join(flags or []) or 'none'}")
        lines += ["", f"### {machine['device']} · {what} · torch {version['torch']} · "
                  f"{record['created'][:10]}", ""]
        if record["settings"].get("note"):
            lines += [f"Note: {record['settings']['note']}", ""]
        lines += _gemm_markdown(record)
        batches = sorted({e["batch"] for e in record["inference"]})
        table = {(e["dtype"], e["batch"]): e["images_per_s"] for e in record["inference"]}
        modes = list(dict.fromkeys(e["dtype"] for e in record["inference"]))
        lines += ["", f"{record['settings']['model']} inference, images/s by batch size "
                  "(\"-\": not measured at that size):", "",
                  "| mode | " + " | ".join(str(b) for b in batches) + " |",
                  "|---" * (len(batches) + 1) + "|"]
        lines += ["| " + " | ".join([m] + [_fmt(table[m, b]) if (m, b) in table else "-"
                                           for b in batches]) + " |" for m in modes]
        top = max([b for b in batches if ("float32", b) in table], default=None)
        lines += _speedup_line(f"Inference at batch {top}",
                               {m: table[m, top] for m in modes if (m, top) in table})
        lines += ["", "Training step (SGD, cross-entropy):", "",
                  "| mode | batch | step ms | peak memory MB |", "|---|---|---|---|"]
        for e in record["train_step"]:
            peak = e.get("peak_memory_bytes") or e.get("peak_tensor_bytes")  # older CPU records
            lines.append(f"| {e['mode']} | {e['batch']} | {_fmt(e['step_ms'])} | "
                         f"{'-' if peak is None else _fmt(peak / 1e6)} |")
        step_ms = {e["mode"]: e["step_ms"] for e in record["train_step"]}
        lines += _speedup_line("Training step", step_ms, lower_is_faster=True)
        for e, scaler in ((e, e["scaler"]) for e in record["train_step"] if e.get("scaler")):
            lines += ["", f"{e['mode']}: the GradScaler skipped {scaler['skipped_steps']} of "
                      f"{scaler['steps']} steps (scale {scaler['init_scale']:g} -> "
                      f"{scaler['final_scale']:g})."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict | None:
    """Command line: measure and save (default), or print the README section (``--readme``)."""
    parser = argparse.ArgumentParser(prog=REPRODUCE, description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda if available, else cpu")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test); needs --out")
    parser.add_argument("--out", help=f"directory to write the JSON file to (default: data/{BENCH_DIR.name}/)")
    parser.add_argument("--note", default="", help="free text stored in settings.note (e.g. the machine's state)")
    parser.add_argument("--readme", action="store_true", help="print the README results section and exit")
    args = parser.parse_args(argv)
    if args.readme:
        print(results_markdown(load_records(args.out or BENCH_DIR)), end="")
        return None
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.exit(1, f"No CUDA device is available here (torch {torch.__version__}, built for CUDA "
                       f"{torch.version.cuda}): nothing recorded. Record this machine with --device cpu.\n")
    if args.quick and not args.out:
        parser.error("--quick needs --out DIR: smoke-test results do not belong in data/benchmarks/")
    command = " ".join([REPRODUCE, shlex.join(argv if argv is not None else sys.argv[1:])]).strip()
    record = measure(args.device, quick=args.quick, note=args.note, command=command)
    print(f"wrote {save_record(record, args.out or BENCH_DIR)}")
    print(results_markdown([record]).split("### ", 1)[1], end="")  # the tables, baselines named
    return record


if __name__ == "__main__":
    main()
