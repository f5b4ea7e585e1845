"""Solutions of notebook 06 (deploying in half precision): each computes its answer with PyTorch."""
from __future__ import annotations

import sys
from functools import lru_cache

import torch
from matplotlib import cbook
from PIL import Image
from torchvision import models

from ..bench import load_records
from ..data import shapes_dataset
from ..device import autocast_dtype, pick_device
from ..dtype_trace import record_ops
from ..measure import parameter_bytes
from ..model import load_reference_model
from ..state import changed, snapshot

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
    with torch.random.fork_rng(devices=[]):  # building initialises weights: leave the learner's generator alone
        model = models.resnet50(weights=None)
    return parameter_bytes(model.half())


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
    with torch.random.fork_rng(devices=[]):  # seeding here must not reseed the learner's generator
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
    """06.4, repaired: eval mode, inference mode, the machine's autocast dtype; no loss, optimizer
    or scaler."""
    model.eval()
    with torch.inference_mode(), torch.amp.autocast(request.device.type,
                                                    dtype=autocast_dtype(request.device)):
        return model(request)


def _calls_with_caught_errors(fn, calls):
    """``fn``'s results, and the name of the first exception raised into ``fn``'s own frame that
    ``fn`` caught (``try``/``except``), else None."""
    code, seen = getattr(fn, "__code__", None), []

    def local(frame, event, arg):
        if event == "exception":
            seen.append(arg[0].__name__)
        return local

    previous = sys.gettrace()
    sys.settrace(lambda frame, event, arg: local if frame.f_code is code else None)
    try:
        results = [fn(*args) for args in calls]
    finally:
        sys.settrace(previous)
    return results, (seen[0] if seen else None)


class ServingJudge:
    """06.4: serves 12 other test images (16 to 28, one per request) with the learner's ``serve``
    to the trained model freshly loaded in training mode, and checks what sections 3 and 5 taught
    and that the convolutions ran in this machine's autocast dtype."""

    def why_not(self, serve) -> str | None:
        if not callable(serve):
            return "the answer should be your repaired function itself (answer_4 = serve)"
        device = pick_device()
        dtype, name = autocast_dtype(device), str(autocast_dtype(device)).removeprefix("torch.")
        model = load_reference_model(device=device).train()
        images, labels = (t[16:28] for t in shapes_dataset("test", n=28).tensors)
        before = snapshot(model)
        try:
            (outputs, caught), ops = record_ops(lambda: _calls_with_caught_errors(
                serve, [(model, image[None].to(device)) for image in images]))
        except Exception as error:  # noqa: BLE001 - the learner's code: say what it raised
            return f"serve raised {type(error).__name__}"
        if caught:
            return (f"serve caught a {caught} with try/except: inference needs no loss, backward "
                    "or step, so nothing to fail")
        moved = changed(before, snapshot(model))
        if any(p.dtype != torch.float32 for p in model.parameters()):
            return "serve converted the model's weights: leave them float32 (autocast casts)"
        if moved & {n for n, _ in model.named_parameters()}:
            return "serving changed the model's weights (an optimizer step)"
        if moved:
            return "serving changed BatchNorm's running statistics (the model is in training mode)"
        if not all(torch.is_tensor(o) for o in outputs):
            kind = type(next(o for o in outputs if not torch.is_tensor(o))).__name__
            return f"serve returns a {kind}: return the logits as the tensor the model gives (one row per request)"
        if not all(torch.is_inference(o) for o in outputs):
            return "the logits are not inference tensors (serve under torch.inference_mode())"
        if any("nll_loss" in op.name or "cross_entropy" in op.name for op in ops):
            return "serve still computes a loss: inference needs none"
        conv = {op.input_dtypes[0] for op in ops if "conv" in op.name}
        if conv != {dtype}:
            ran = ", ".join(sorted(str(d).removeprefix("torch.") for d in conv))
            return f"the convolutions ran in {ran}, not in {name} (this machine's autocast dtype)"
        reason = _why_not_logits(outputs, _float32_logits(images.to(device)))
        if reason is not None:
            return reason
        wrong = sum(int(o.argmax()) != int(y) for o, y in zip(outputs, labels))
        if wrong:
            return f"{wrong} of {len(labels)} requests got another class than the trained model's"
        return None


def _float32_logits(images: torch.Tensor) -> torch.Tensor:
    """The trained model's float32 logits of each image (eval mode), one row each."""
    model = load_reference_model(device=images.device).eval()
    with torch.inference_mode():
        return model(images).float()


def _why_not_logits(outputs: list, logits: torch.Tensor) -> str | None:
    """What the outputs (tensors) are, if not the logits (one row of classes per request, as the broken
    serve returned): class indices, probabilities, log-probabilities, or other numbers."""
    if any(o.shape != (1, logits.shape[1]) for o in outputs):
        shapes = sorted({tuple(o.shape) for o in outputs})
        if not any(o.is_floating_point() for o in outputs) or all(o.numel() == 1 for o in outputs):
            return (f"serve returns the predicted class (shape {shapes[0]}), not the logits: return the "
                    f"model's output, one row of {logits.shape[1]} logits per request")
        return f"serve returns tensors of shape {shapes}, not one row of {logits.shape[1]} logits per request"
    got = torch.cat([o.float() for o in outputs])
    if (got >= 0).all() and torch.allclose(got.sum(-1), torch.ones(len(got)), atol=1e-2):
        return "serve returns probabilities (a softmax of the logits): return the logits themselves"
    if (got <= 0).all() and torch.allclose(got.exp().sum(-1), torch.ones(len(got)), atol=1e-2):
        return "serve returns log-probabilities (a log_softmax): return the logits themselves"
    error = (got - logits).abs().max().item()
    if error > 0.05 * logits.abs().max().item():  # bfloat16 autocast: well under 1 %
        return (f"the logits differ from the trained model's by up to {error:.3g}: serve the model as "
                "loaded, in eval mode, under autocast")
    return None


SOLUTIONS = {
    "06.1": half_resnet50_bytes,
    "06.2": recorded_cpu_bf16_speedup,
    "06.3": fp16_headroom_on_photo,
    "06.4": ServingJudge,
}
