"""Notebook 06's scaffolding: the photo, logit comparisons, oneDNN's kernels, the sweep table."""

import os
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from .data import shapes_dataset
from .model import load_reference_model
from .state import changed, snapshot

LAYOUTS = {"contiguous (NCHW)": torch.contiguous_format,
           "channels_last (NHWC)": torch.channels_last}


def load_photo(device: str | torch.device = "cpu"):
    """``(image, preprocess, batch)``: the bundled Grace Hopper photo, ResNet-50 transforms, NCHW"""
    from matplotlib import cbook
    from PIL import Image
    from torchvision import models
    with cbook.get_sample_data("grace_hopper.jpg") as f:
        image = Image.open(f).convert("RGB")
    preprocess = models.ResNet50_Weights.DEFAULT.transforms()
    return image, preprocess, preprocess(image).unsqueeze(0).contiguous().to(device)


def show_photo(image, preprocess, batch: torch.Tensor):
    """The photo next to the model's input (normalisation undone): the figure."""
    import matplotlib.pyplot as plt
    fig, (ax_photo, ax_input) = plt.subplots(1, 2, figsize=(6, 3.5), dpi=80)
    mean, std = (torch.tensor(v).view(3, 1, 1) for v in (preprocess.mean, preprocess.std))
    ax_photo.imshow(image)
    ax_input.imshow((batch[0].cpu() * std + mean).clamp(0, 1).permute(1, 2, 0))
    for ax, title in ((ax_photo, "the photo, {}x{}".format(*image.size)),
                      (ax_input, f"the model's input, {batch.shape[-1]}x{batch.shape[-2]}")):
        ax.set(title=title, xlabel="x (pixels)", ylabel="y (pixels)")
    fig.tight_layout()
    return fig


def resize(batch: torch.Tensor, side: int) -> torch.Tensor:
    """``batch`` resized to ``side`` x ``side`` (antialiased bilinear); itself if already so."""
    if tuple(batch.shape[-2:]) == (side, side):
        return batch
    return nn.functional.interpolate(batch, size=(side, side), mode="bilinear", antialias=True,
                                     align_corners=False)


def compare_logits(logits: torch.Tensor, reference: torch.Tensor) -> dict[str, Any]:
    """``logits`` against the fp32 ``reference``: dtype, relative error, top-1 same, top-5 shared"""
    dtype, logits, reference = logits.dtype, logits.float(), reference.float()
    error = ((logits - reference).abs().max() / reference.abs().max()).item()
    shared = set(logits.topk(5).indices[0].tolist()) & set(reference.topk(5).indices[0].tolist())
    return {"dtype": str(dtype).removeprefix("torch."), "relative error": float(f"{error:.2g}"),
            "top-1 same": logits.argmax().item() == reference.argmax().item(),
            "top-5 shared": len(shared)}


def _c_stdout_of(fn: Callable[[], Any]) -> str:
    """What ``fn()`` writes to file descriptor 1 (oneDNN prints there, below ``sys.stdout``)."""
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
    """``{layout: ["convolution brg_conv_fwd:avx512_core", ...]}``: oneDNN's kernels per layout."""
    torch.manual_seed(0)
    conv, x = torch.nn.Conv2d(64, 64, 3, padding=1).eval(), torch.randn(1, 64, 56, 56)
    kernels: dict[str, list[str]] = {}
    for name, layout in LAYOUTS.items():
        def run(layout: torch.memory_format = layout) -> None:
            verbose = torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON)
            with torch.inference_mode(), verbose:
                conv.to(memory_format=layout)(x.contiguous(memory_format=layout))

        lines = [line.split(",") for line in _c_stdout_of(run).splitlines()
                 if re.match(r"onednn_verbose,(v\d+,)?(primitive,)?exec,cpu,", line)]
        kernels[name] = [f"{f[f.index('cpu') + 1]} {f[f.index('cpu') + 2]}" for f in lines]
    return kernels


def photo_batch(photo: torch.Tensor, n: int, side: int) -> torch.Tensor:
    """``n`` copies of the photo at ``side`` x ``side``, channels_last: the requests of one batch."""
    images = resize(photo, side).expand(n, -1, -1, -1)
    return images.contiguous(memory_format=torch.channels_last)


def memory_table(entries: Sequence[dict]) -> str:
    """The memory sweep as a text table: MiB of tensors per request (reserved MiB: CUDA only)."""
    lines = [f"{'mode':18} {'batch':>5} {'MiB/request':>12} {'reserved MiB':>13}"]
    for e in entries:
        per_request = e["peak_memory_bytes"] / e["batch"] / 2**20
        reserved = e.get("peak_reserved_bytes")
        reserved_text = "-" if reserved is None else f"{reserved / 2**20:.1f}"
        lines.append(f"{e['dtype']:18} {e['batch']:5} {per_request:12.2f} {reserved_text:>13}")
    return "\n".join(lines)


def serving_result(serve: Callable[[nn.Module, torch.Tensor], torch.Tensor],
                   device: str | torch.device = "cpu", n: int = 16) -> tuple[bool, bool, list[int]]:
    """Serve ``n`` images to the CNN (training mode): (model unchanged, all inference, classes)"""
    model = load_reference_model(device=device).train()
    requests = shapes_dataset("test", n=n).tensors[0].to(device)
    before = snapshot(model)
    outputs = [serve(model, requests[i:i + 1]) for i in range(n)]
    return not changed(before, snapshot(model)), all(torch.is_inference(o) for o in outputs), [
        int(o.argmax()) for o in outputs]
