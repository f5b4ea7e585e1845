"""Solutions of notebook 06 (deploying in half precision): each computes its answer with PyTorch."""
from __future__ import annotations

from functools import lru_cache

import torch
from matplotlib import cbook
from PIL import Image
from torchvision import models

from ..bench import load_records
from ..nb06 import serving_result
from ..measure import parameter_bytes

TOLERANCES = {"06.2": 0.01, "06.3": 0.005}


def photo_batch() -> torch.Tensor:
    """The notebook's photo (matplotlib's bundled Grace Hopper), preprocessed for ResNet-50, as a
    batch of one."""
    with cbook.get_sample_data("grace_hopper.jpg") as f:
        image = Image.open(f).convert("RGB")
    return models.ResNet50_Weights.DEFAULT.transforms()(image).unsqueeze(0)


@lru_cache(maxsize=1)
def half_resnet50_bytes() -> int:
    """06.1: bytes of a ResNet-50's parameters and buffers after ``.half()`` (num_batches_tracked
    stays int64)."""
    return parameter_bytes(models.resnet50(weights=None).half())


def recorded_cpu_bf16_speedup() -> float:
    """06.2: best bf16 images/s over best fp32 images/s (over batch sizes) in the first recorded CPU
    file."""
    inference = load_records(device="cpu")[0]["inference"]
    best = {mode: max(e["images_per_s"] for e in inference if e["dtype"] == mode)
            for mode in ("bfloat16", "float32")}
    return best["bfloat16"] / best["float32"]


@lru_cache(maxsize=1)
def fp16_headroom_on_photo() -> float:
    """06.3: fp16 max / the largest |output| of any module of a seeded eval-mode ResNet-50 on the
    photo (fp32)."""
    torch.manual_seed(0)
    model = models.resnet50(weights=None).eval()
    largest: list[float] = []
    for module in model.modules():
        module.register_forward_hook(
            lambda module, inputs, output: largest.append(output.abs().max().item()))
    with torch.inference_mode():
        model(photo_batch())
    return torch.finfo(torch.float16).max / max(largest)


def serve(model: torch.nn.Module, request: torch.Tensor) -> torch.Tensor:
    """The repaired serving function of 06.4: eval mode, inference mode, autocast; no loss,
    optimizer or scaler."""
    model.eval()
    with torch.inference_mode(), torch.amp.autocast(request.device.type, dtype=torch.bfloat16):
        return model(request)


@lru_cache(maxsize=1)
def repaired_serving_result() -> tuple[bool, bool, list[int]]:
    """06.4: (model unchanged, inference tensors, predicted classes) of the repaired ``serve``, on
    CPU."""
    return serving_result(serve, "cpu")


SOLUTIONS = {
    "06.1": half_resnet50_bytes,
    "06.2": recorded_cpu_bf16_speedup,
    "06.3": fp16_headroom_on_photo,
    "06.4": repaired_serving_result,
}
