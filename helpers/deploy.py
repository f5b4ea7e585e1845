"""Harnesses of notebook 06 (deploying in half precision): the photo, state snapshots, logit comparisons,
channels_last timings and kernels, the live inference sweep, recorded GEMMs against datasheet peaks, and the
serving check of exercise 06.4.

The notebook keeps the idea in its cells; the bookkeeping around each experiment lives here, tested in
``tests/test_deploy.py``.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn

from .device import strict_fp32
from .speed import workload
from .measure import parameter_bytes, time_it
from .state import changed, snapshot

LAYOUTS = {"contiguous (NCHW)": torch.contiguous_format, "channels_last (NHWC)": torch.channels_last}


# --- the photo ---------------------------------------------------------------------------------------------------

def load_photo(device: str | torch.device = "cpu"):
    """matplotlib's bundled photo of Grace Hopper (public domain, no download) and its ResNet-50 preprocessing.

    Returns ``(image, preprocess, batch)``: the PIL image, torchvision's ``ResNet50_Weights.DEFAULT.transforms()``
    (resize, centre crop, normalise) and the preprocessed batch of one, 1 x 3 x 224 x 224 float32 on ``device``,
    contiguous (NCHW). (The transforms alone would keep the decoded image's pixel-by-pixel layout, channels_last.)
    """
    from matplotlib import cbook
    from PIL import Image
    from torchvision import models

    with cbook.get_sample_data("grace_hopper.jpg") as f:
        image = Image.open(f).convert("RGB")
    preprocess = models.ResNet50_Weights.DEFAULT.transforms()
    return image, preprocess, preprocess(image).unsqueeze(0).contiguous().to(device)


def show_photo(image, preprocess, batch: torch.Tensor):
    """Plot the photo next to the model's input (the normalisation undone); returns the figure."""
    import matplotlib.pyplot as plt

    fig, (ax_photo, ax_input) = plt.subplots(1, 2, figsize=(6, 3.5), dpi=80)
    mean = torch.tensor(preprocess.mean).view(3, 1, 1)
    std = torch.tensor(preprocess.std).view(3, 1, 1)
    ax_photo.imshow(image)
    ax_photo.set_title(f"the photo, {image.size[0]}x{image.size[1]}")
    ax_input.imshow((batch[0].cpu() * std + mean).clamp(0, 1).permute(1, 2, 0))
    ax_input.set_title(f"the model's input, {batch.shape[-1]}x{batch.shape[-2]}")
    for ax in (ax_photo, ax_input):
        ax.set(xlabel="x (pixels)", ylabel="y (pixels)")
    fig.tight_layout()
    return fig


def resize(batch: torch.Tensor, side: int) -> torch.Tensor:
    """``batch`` (N x C x H x W) resized to ``side`` x ``side`` (antialiased bilinear); itself if already that size."""
    if tuple(batch.shape[-2:]) == (side, side):
        return batch
    return nn.functional.interpolate(batch, size=(side, side), mode="bilinear", antialias=True,
                                     align_corners=False)


# --- section 1: where the names live -----------------------------------------------------------------------------

def torch_sources_mentioning(*names: str) -> tuple[int, list[str]]:
    """(how many ``.py`` files the installed torch package has, those that mention any of ``names``, relative)."""
    root = Path(torch.__file__).parent
    files = sorted(root.rglob("*.py"))
    hits = [str(p.relative_to(root)) for p in files if any(n in p.read_text(errors="ignore") for n in names)]
    return len(files), hits


# --- section 3: what a training step does to a model --------------------------------------------------------------

def logits_with(net: nn.Module, state: dict[str, torch.Tensor], batch: torch.Tensor) -> torch.Tensor:
    """``net``'s logits for ``batch`` with ``state`` loaded, in eval mode, under inference_mode, strict fp32."""
    net.load_state_dict(state)
    net.eval()
    with torch.inference_mode(), strict_fp32():
        return net(batch)


# --- section 6: 16-bit logits against fp32 ------------------------------------------------------------------------

def compare_logits(logits: torch.Tensor, reference: torch.Tensor) -> dict[str, Any]:
    """How far one image's ``logits`` (any dtype) are from the fp32 ``reference`` logits (1 x classes).

    Returns the logits' dtype, the largest logit error relative to the largest reference logit, whether the top-1
    class agrees and how many of the top-5 classes are shared.
    """
    dtype, logits, reference = logits.dtype, logits.float(), reference.float()
    error = ((logits - reference).abs().max() / reference.abs().max()).item()
    shared = set(logits.topk(5).indices[0].tolist()) & set(reference.topk(5).indices[0].tolist())
    return {"dtype": str(dtype).removeprefix("torch."), "relative error": float(f"{error:.2g}"),
            "top-1 same": logits.argmax().item() == reference.argmax().item(), "top-5 shared": len(shared)}


# --- section 6: channels_last -------------------------------------------------------------------------------------

def layout_times(model: nn.Module, batch: torch.Tensor, dtype: torch.dtype | None = None,
                 min_run_time: float = 0.05) -> dict[str, float]:
    """Milliseconds per inference of ``model`` on ``batch`` in each memory layout (median, ``helpers.time_it``).

    The model and the input are converted to each layout of :data:`LAYOUTS` (copies of the same values); with a
    ``dtype`` the forward runs under ``torch.amp.autocast`` in it, else in strict fp32.
    """
    device = batch.device
    times = {}
    for name, layout in LAYOUTS.items():
        net = model.to(memory_format=layout).eval()
        x = batch.contiguous(memory_format=layout)

        def forward() -> torch.Tensor:
            with torch.inference_mode(), strict_fp32(), torch.amp.autocast(
                    device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                return net(x)

        # no separate warm-up: Timer's first call (it sizes the timed blocks) is not among those timed
        times[name] = time_it(forward, min_run_time=min_run_time).median * 1e3
    model.to(memory_format=torch.contiguous_format)
    return times


def _c_stdout_of(fn: Callable[[], Any]) -> str:
    """What ``fn()`` writes to the process's file descriptor 1 (C libraries such as oneDNN print there, below
    Python's ``sys.stdout``, so a notebook cell would not show it)."""
    sys.stdout.flush()
    with tempfile.TemporaryFile() as captured:
        saved = os.dup(1)
        os.dup2(captured.fileno(), 1)
        try:
            fn()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        captured.seek(0)
        return captured.read().decode(errors="replace")


def onednn_conv_kernels() -> dict[str, list[str]]:
    """Which oneDNN primitives one CPU convolution runs per memory layout, read from oneDNN's verbose log.

    Runs a 64-channel 3x3 convolution on a 56x56 image, once contiguous and once channels_last, with
    ``torch.backends.mkldnn.verbose`` on (the in-process form of ``ONEDNN_VERBOSE=1``), and returns ``{layout
    name: ["reorder jit:blk", ..., "convolution brg_conv_fwd:avx512_core", ...]}``: each primitive with its
    implementation. Empty lists where this build of PyTorch does not run convolutions through oneDNN.
    """
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(64, 64, 3, padding=1).eval()
    x = torch.randn(1, 64, 56, 56)
    kernels: dict[str, list[str]] = {}
    for name, layout in LAYOUTS.items():
        def run(layout: torch.memory_format = layout) -> None:
            with torch.inference_mode(), torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                conv.to(memory_format=layout)(x.contiguous(memory_format=layout))

        kernels[name] = []
        for line in _c_stdout_of(run).splitlines():
            if re.match(r"onednn_verbose,(v\d+,)?(primitive,)?exec,cpu,", line):
                fields = line.split(",")
                at = fields.index("cpu")
                kernels[name].append(f"{fields[at + 1]} {fields[at + 2]}")
    return kernels


# --- section 7: the live inference sweep --------------------------------------------------------------------------

def mode_dtype(mode: str) -> torch.dtype:
    """The dtype whose arithmetic an inference mode of ``helpers.bench`` runs: float32, bfloat16 or float16."""
    return getattr(torch, mode.removeprefix("autocast_").replace("tf32", "float32"))


def sweep_plan(device: str | torch.device, amp_dtype: torch.dtype, batches: Sequence[int] = (1, 4),
               image_size: int = 128, reduced_image_size: int = 64) -> dict[str, Any]:
    """What the notebook's sweep measures on ``device``: ``{"image_size": int, "batches": {mode: [batch sizes]}}``.

    Modes: float32, autocast in ``amp_dtype``, and the model converted to bfloat16 and to float16 (those the device
    has: ``bench.absent_reason``, e.g. no bf16 on a T4). A mode whose
    dtype this machine emulates (``helpers.workload``) runs at batch 1 only, and then every mode runs on smaller
    images, so that each mode is compared with float32 on the same work. On a GPU, larger batches.
    """
    device = torch.device(device)
    if device.type == "cuda":
        batches, image_size = (1, 8, 32), 224
    from .bench import absent_reason

    modes = ["float32", f"autocast_{str(amp_dtype).removeprefix('torch.')}", "bfloat16", "float16"]
    modes = [mode for mode in modes if absent_reason(mode, device) is None]  # e.g. no bf16 on a T4 or V100
    plan = {mode: [b for b in batches if b <= workload(mode_dtype(mode), max(batches), 1, device)]
            for mode in modes}
    all_fast = all(len(b) == len(batches) for b in plan.values())
    return {"image_size": image_size if all_fast else reduced_image_size, "batches": plan}


def inference_sweep(model: nn.Module, plan: dict[str, Any], device: str | torch.device,
                    min_run_time: float = 0.05) -> tuple[list[dict], dict[str, int]]:
    """Run ``helpers.bench.inference`` for every mode and batch size of ``plan`` (from :func:`sweep_plan`).

    Returns the entries (images/s, latency, memory per call; see ``helpers.bench``) and the bytes of the served
    model's weights per mode. Each mode serves its own copy of ``model`` (``bench.prepare_model``: eval mode,
    channels_last, converted for float16/bfloat16).
    """
    from . import bench

    entries, weights = [], {}
    for mode, batches in plan["batches"].items():
        served = bench.prepare_model(model, mode, device)
        weights[mode] = parameter_bytes(served)
        for batch in batches:
            entries.append(bench.inference(served, mode, batch, image_size=plan["image_size"],
                                           min_run_time=min_run_time))
        del served
    return entries, weights


def entry(entries: Sequence[dict], mode: str, batch: int) -> dict:
    """The sweep entry of ``mode`` at ``batch``."""
    return next(e for e in entries if e["dtype"] == mode and e["batch"] == batch)


def sweep_table(entries: Sequence[dict]) -> str:
    """The sweep as a text table: images/s, latency and memory per request (and reserved memory on CUDA)."""
    reserved = any(e.get("peak_reserved_bytes") is not None for e in entries)
    lines = [f"{'mode':18} {'batch':>5} {'images/s':>9} {'latency ms':>11} {'MiB/request':>12}"
             + (f" {'reserved MiB':>13}" if reserved else "")]
    for e in entries:
        line = (f"{e['dtype']:18} {e['batch']:5} {e['images_per_s']:9.1f} {e['latency_ms']:11.1f} "
                f"{e['peak_memory_bytes'] / e['batch'] / 2**20:12.2f}")
        if reserved:
            line += f" {(e.get('peak_reserved_bytes') or 0) / 2**20:13.1f}"
        lines.append(line)
    return "\n".join(lines)


def concurrency(entries: Sequence[dict], weights: dict[str, int], low: str = "bfloat16") -> dict[str, float]:
    """The concurrency question in numbers: float32 over ``low`` at batch 1, for the memory one request allocates
    (activations), the weights, and images/s (the speed-up: above 1 means ``low`` serves faster)."""
    fp32, half = entry(entries, "float32", 1), entry(entries, low, 1)
    return {"activation memory per request, fp32 / 16-bit": fp32["peak_memory_bytes"] / half["peak_memory_bytes"],
            "weights, fp32 / 16-bit": weights["float32"] / weights[low],
            "images/s, 16-bit / fp32": half["images_per_s"] / fp32["images_per_s"]}


def plot_sweep(entries: Sequence[dict], title: str = "ResNet-50 here"):
    """Throughput against batch size per mode, and the memory one request allocates per mode; returns the figure."""
    import matplotlib.pyplot as plt

    from . import bench

    fig, (ax_speed, ax_memory) = plt.subplots(1, 2, figsize=(8, 3.5), dpi=80)
    bench.plot_inference([{"machine": {"device": "here"}, "inference": list(entries)}], ax=ax_speed)
    ax_speed.set_title(f"{title}: throughput")
    modes = list(dict.fromkeys(e["dtype"] for e in entries))
    per_request = [entry(entries, m, 1)["peak_memory_bytes"] / 2**20 for m in modes]
    ax_memory.bar(modes, per_request, color=[f"C{i}" for i in range(len(modes))])
    ax_memory.set(ylabel="MiB per request (batch 1)", title="activation memory one request allocates")
    ax_memory.tick_params(axis="x", labelrotation=20, labelsize=8)
    fig.tight_layout()
    return fig


# --- section 8: recorded GEMMs against the datasheet --------------------------------------------------------------

def _fraction_of_peak(tflops: float, device_name: str, dtype: str) -> float | None:
    from .peaks import fraction_of_peak

    return fraction_of_peak(tflops, device_name, dtype)


def gemm_vs_peak(records: Sequence[dict],
                 fraction: Callable[[float, str, str], float | None] | None = None) -> list[dict[str, Any]]:
    """One row per recorded GEMM of the GPU ``records``: device, dtype, n, TFLOP/s and the fraction of the GPU's
    dense datasheet peak (``helpers.peaks``; None for a GPU or format the peaks file does not list)."""
    fraction = fraction or _fraction_of_peak
    rows = []
    for record in records:
        name = record["machine"]["device_name"]
        for e in record["gemm"]:
            if e["tflops"] is None or record["machine"]["device"] != "cuda":
                continue
            share = e.get("fraction_of_peak") or fraction(e["tflops"], name, e["dtype"])
            rows.append({"device": name, "dtype": e["dtype"], "n": e["n"], "TFLOP/s": round(e["tflops"], 1),
                         "fraction of peak": None if share is None else round(share, 2)})
    return rows


# --- exercise 06.4: serving ---------------------------------------------------------------------------------------

def serving_requests(n: int = 16, device: str | torch.device = "cpu") -> torch.Tensor:
    """``n`` test images of the course's shapes dataset (seeded: always the same), N x 3 x 32 x 32 on ``device``."""
    from .data import shapes_dataset

    return shapes_dataset("test", n=n).tensors[0].to(device)


def serving_model(device: str | torch.device = "cpu") -> nn.Module:
    """The trained reference CNN as a freshly built model that loaded its checkpoint is: in training mode."""
    from .model import load_reference_model

    return load_reference_model(device=device).train()


def serving_result(serve: Callable[[nn.Module, torch.Tensor], torch.Tensor],
                   device: str | torch.device = "cpu", n: int = 16) -> tuple[bool, bool, list[int]]:
    """Serve ``n`` requests one at a time with ``serve(model, request) -> logits``, as a server would.

    Returns (whether every parameter and buffer of the model is unchanged afterwards, whether every returned
    logits tensor is an inference tensor (made under ``torch.inference_mode()``), the predicted class of each
    request). A correct ``serve`` gives ``(True, True, <the model's predictions>)``.
    """
    model, requests = serving_model(device), serving_requests(n, device)
    before = snapshot(model)
    outputs = [serve(model, requests[i:i + 1]) for i in range(n)]
    unchanged = not changed(before, snapshot(model))
    return unchanged, all(torch.is_inference(o) for o in outputs), [int(o.argmax()) for o in outputs]
