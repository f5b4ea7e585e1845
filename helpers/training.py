"""The course's one training loop and its evaluation (float32, autocast, GradScaler): notebooks 03,
04 and 07. ``helpers.train`` is the loop; this module is ``helpers.training``."""

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from .device import check_autocast_dtype, strict_fp32


@dataclass
class TrainLog:
    """What a training run recorded per step, and its wall time."""

    losses: list[float] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)  # GradScaler.get_scale() after each update
    skipped_steps: int = 0    # steps whose optimizer.step() the scaler skipped (inf/NaN gradients)
    scheduler_steps: int = 0  # scheduler.step() calls: one per optimizer step that really ran
    seconds: float = 0.0


def make_scaler(device_type: str, amp_dtype: torch.dtype | None, **kwargs) -> torch.amp.GradScaler:
    """A ``GradScaler`` for fp16 autocast; raises for bf16 or fp32 (none needed): 04 §7."""
    if amp_dtype != torch.float16:
        raise ValueError(f"No GradScaler is needed with {amp_dtype}: bfloat16 and float32 have "
                         "float32's exponent range, so small gradients do not underflow.")
    return torch.amp.GradScaler(device_type, **kwargs)


def amp_step(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor,
             optimizer: torch.optim.Optimizer, *, amp_dtype: torch.dtype | None = None,
             scaler: torch.amp.GradScaler | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One recipe step (03): autocast forward and loss, backward (via ``scaler``); (loss, logits)"""
    optimizer.zero_grad(set_to_none=True)
    with torch.amp.autocast(inputs.device.type, dtype=amp_dtype or torch.float32,
                            enabled=amp_dtype is not None):
        logits = model(inputs)
        loss = F.cross_entropy(logits, labels)
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    return loss, logits


def skipped_by_scaler(scale_before: float, scale_after: float) -> bool:
    """Whether a ``GradScaler`` step skipped: ``update()`` lowers the scale exactly then (04 §4)."""
    return scale_after < scale_before


def recipe_step(model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None,
                inputs: torch.Tensor, labels: torch.Tensor, amp_dtype: torch.dtype | None) -> torch.Tensor:
    """:func:`amp_step` in the signature :func:`train` calls a step with; the loss."""
    return amp_step(model, inputs, labels, optimizer, amp_dtype=amp_dtype, scaler=scaler)[0]


def train(model: nn.Module, batches: Iterable, optimizer: torch.optim.Optimizer, *, epochs: int = 1,
          amp_dtype: torch.dtype | None = None, scaler: torch.amp.GradScaler | None = None,
          scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
          max_steps: int | None = None, step: Callable = recipe_step) -> TrainLog:
    """Call ``step(model, optimizer, scaler, inputs, labels, amp_dtype)`` (default: the recipe,
    :func:`amp_step`) on every batch, strict fp32 outside autocast; ``scheduler`` after real steps"""
    device = next(model.parameters()).device
    if amp_dtype is not None:
        check_autocast_dtype(device.type, amp_dtype)
    if scaler is not None and amp_dtype != torch.float16:
        make_scaler(device.type, amp_dtype)  # raises the explanatory error
    log = TrainLog()
    model.train()
    start = time.perf_counter()
    with strict_fp32():
        for _ in range(epochs):
            for inputs, labels in batches:
                if max_steps is not None and len(log.losses) >= max_steps:
                    break
                scale_before = scaler.get_scale() if scaler is not None else None
                loss = step(model, optimizer, scaler, inputs.to(device), labels.to(device), amp_dtype)
                stepped = True
                if scaler is not None:
                    log.scales.append(scaler.get_scale())
                    stepped = not skipped_by_scaler(scale_before, log.scales[-1])
                    log.skipped_steps += not stepped
                if scheduler is not None and stepped:
                    scheduler.step()
                    log.scheduler_steps += 1
                log.losses.append(loss.item())
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    log.seconds = time.perf_counter() - start
    model.eval()
    return log


@dataclass
class EvalResult:
    """Accuracy and the raw logits (float32) of an evaluation run."""

    accuracy: float
    logits: torch.Tensor
    predictions: torch.Tensor


@torch.inference_mode()
def evaluate(model: nn.Module, dataset: torch.utils.data.TensorDataset, *, batch_size: int = 500,
             input_dtype: torch.dtype | None = None,
             amp_dtype: torch.dtype | None = None) -> EvalResult:
    """Evaluate under inference_mode: inputs in ``input_dtype``, or autocast; float32 logits. 01"""
    device = next(model.parameters()).device
    if amp_dtype is not None:
        check_autocast_dtype(device.type, amp_dtype)
    model.eval()
    inputs, labels = dataset.tensors
    chunks = []
    for start in range(0, len(inputs), batch_size):
        x = inputs[start : start + batch_size].to(device)
        if input_dtype is not None:
            x = x.to(input_dtype)
        with strict_fp32(), torch.amp.autocast(device.type, dtype=amp_dtype or torch.float32,
                                               enabled=amp_dtype is not None):
            chunks.append(model(x).float().cpu())
    logits = torch.cat(chunks)
    predictions = logits.argmax(dim=1)
    return EvalResult((predictions == labels).float().mean().item(), logits, predictions)
