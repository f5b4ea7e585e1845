"""Tools for notebook 04: gradient underflow and overflow fractions, and a GradScaler driven through injected infs.

The CUDA-rule tools (:func:`simulated_cuda_autocast`, :func:`autocast_rule_devices`) rest on private PyTorch APIs
(``torch._subclasses.fake_tensor``, ``torch._C._dispatch_dump``). They report when those are missing instead of
breaking a notebook: check :func:`cuda_simulation_available` first, and expect ``None`` from
:func:`autocast_rule_devices`.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn


def _stored(values: torch.Tensor, dtype: torch.dtype, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The non-zero entries of ``values`` (as float64) and the same entries multiplied by ``scale`` stored in ``dtype``."""
    if not dtype.is_floating_point:
        raise TypeError(f"{dtype} is not a floating-point dtype")
    if not scale > 0:
        raise ValueError(f"scale must be positive, not {scale}")
    exact = values.detach().flatten().to(torch.float64)
    exact = exact[exact != 0]
    if exact.numel() == 0:
        raise ValueError("values has no non-zero entry: nothing to measure")
    return exact, (exact * scale).to(dtype)


def underflow_fraction(values: torch.Tensor, dtype: torch.dtype = torch.float16, scale: float = 1.0) -> float:
    """Fraction of the non-zero ``values`` that round to exactly 0 (underflow) when ``values * scale`` is stored
    as ``dtype``: those closer to 0 than half of ``dtype``'s smallest subnormal number.

    ``scale`` is a loss scale: with ``scale=2**16`` this is what a ``GradScaler``'s default scale loses. The
    result depends only on the stored values and ``dtype``'s range, not on any kernel.
    """
    _, stored = _stored(values, dtype, scale)
    return (stored == 0).double().mean().item()


def overflow_fraction(values: torch.Tensor, dtype: torch.dtype = torch.float16, scale: float = 1.0) -> float:
    """Fraction of the non-zero ``values`` that become inf when ``values * scale`` is stored as ``dtype``."""
    _, stored = _stored(values, dtype, scale)
    return stored.isinf().double().mean().item()


def subnormal_fraction(values: torch.Tensor, dtype: torch.dtype = torch.float16, scale: float = 1.0) -> float:
    """Fraction of the non-zero ``values`` that land below ``dtype``'s smallest normal number (precision is lost
    there: fp16 subnormals keep fewer than 10 significant bits), counting those that round to 0."""
    _, stored = _stored(values, dtype, scale)
    return (stored.abs() < torch.finfo(dtype).smallest_normal).double().mean().item()


def gradients(module: nn.Module) -> torch.Tensor:
    """All parameter gradients of ``module`` flattened into one float32 tensor (parameters without a grad are
    skipped; raises ``ValueError`` if none has one: run ``backward()`` first)."""
    grads = [p.grad.detach().flatten().float() for p in module.parameters() if p.grad is not None]
    if not grads:
        raise ValueError("no parameter has a .grad: call backward() first")
    return torch.cat(grads)


def injected_inf_steps(steps: Iterable[bool], *, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                       backoff_factor: float = 0.5, growth_interval: int = 2000) -> list[float]:
    """Run a real ``torch.amp.GradScaler("cpu")`` through a sequence of steps and return its scale after each
    ``update()``. ``steps`` holds True for a step whose gradient is inf (injected) and False for a clean one.

    The model is a single fp32 weight with a hand-set gradient, so only the scaler's logic is exercised.
    """
    weight = nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([weight], lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_factor=growth_factor,
                                  backoff_factor=backoff_factor, growth_interval=growth_interval)
    scales = []
    for bad in steps:
        optimizer.zero_grad()
        scaler.scale(weight.sum()).backward()
        if bad:
            weight.grad.fill_(float("inf"))
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales
