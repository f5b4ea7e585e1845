"""Tools for notebooks 03 and 04: gradient underflow, bit-exact comparisons, and CUDA autocast rules without a GPU.

The CUDA-rule tools (:func:`simulated_cuda_autocast`, :func:`autocast_rule_devices`) rest on private PyTorch APIs
(``torch._subclasses.fake_tensor``, ``torch._C._dispatch_dump``). They report when those are missing instead of
breaking a notebook: check :func:`cuda_simulation_available` first, and expect ``None`` from
:func:`autocast_rule_devices`.
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import nn

from .device import _version_at_least, autocast_state
from .formats import _INT_VIEW

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


def snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of every parameter and buffer of ``module`` (its ``state_dict``, cloned)."""
    return {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when ``a`` and ``b`` have the same dtype, shape and bit pattern (so NaN equals the same NaN and
    ``-0.0`` differs from ``0.0``, unlike ``torch.equal``)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        view = _INT_VIEW[a.element_size() * 8]
        return torch.equal(a.contiguous().view(view), b.contiguous().view(view))
    return torch.equal(a, b)


def same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """True when two state dicts (e.g. from :func:`snapshot`) hold the same names and bit-identical tensors."""
    return a.keys() == b.keys() and all(bitwise_equal(a[name], b[name]) for name in a)


def max_abs_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest absolute difference between matching floating tensors of two state dicts (same names required)."""
    if a.keys() != b.keys():
        raise ValueError("the two state dicts do not hold the same names")
    diffs = [(a[k].double() - b[k].double()).abs().max().item() for k in a if a[k].is_floating_point()]
    return max(diffs, default=0.0)


def optimizer_snapshot(optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """A detached copy of the optimizer's per-parameter state (e.g. Adam's ``step``, ``exp_avg``, ``exp_avg_sq``),
    keyed ``"<parameter index>.<name>"``; compare two snapshots with :func:`same_state`.

    Non-tensor entries become tensors, so a snapshot holds only tensors. An optimizer that has not stepped yet
    has no state: its snapshot is empty.
    """
    snapshot_: dict[str, torch.Tensor] = {}
    for index, state in optimizer.state_dict()["state"].items():
        for name, value in state.items():
            tensor = value.detach().clone() if isinstance(value, torch.Tensor) else torch.tensor(value)
            snapshot_[f"{index}.{name}"] = tensor
    return snapshot_


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


class SimulationUnavailable(RuntimeError):
    """The installed PyTorch cannot apply its CUDA autocast rules to fake tensors (see :func:`cuda_simulation_available`)."""


def _fake_tensor_mode() -> type:
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode  # private API: may move between releases
    except ImportError as error:
        raise SimulationUnavailable(f"simulated CUDA autocast needs torch._subclasses.fake_tensor ({error})") from error
    return FakeTensorMode


FAKE_CUDA_WITHOUT_GPU = (2, 10)  # first release whose fake CUDA tensors need no GPU (pytorch/pytorch#163016)


def _check_fake_cuda_stays_off_the_runtime() -> None:
    """Raise :class:`SimulationUnavailable` where fake CUDA tensors would call the real CUDA runtime.

    Before torch 2.10, the Python bindings of indexing (``t[0]``), ``copy_`` (used by every module's weight
    initialisation) and a few other methods take a real CUDA *device guard*, even on a fake tensor: on a machine
    without a usable GPU that fails ("CUDA driver version is insufficient", or "not linked with support for cuda
    devices" on a CPU-only build). From 2.10 the guard is a no-op there. With a GPU, any release works.
    """
    if _version_at_least(torch.__version__, FAKE_CUDA_WITHOUT_GPU) or torch.cuda.is_available():
        return
    raise SimulationUnavailable(
        f"torch {torch.__version__} takes a real CUDA device guard for some operations on fake CUDA tensors "
        f"(indexing, copy_); simulating CUDA autocast without a GPU needs torch >= "
        f"{'.'.join(map(str, FAKE_CUDA_WITHOUT_GPU))}"
    )


@contextmanager
def simulated_cuda_autocast(dtype: torch.dtype = torch.float16) -> Iterator[None]:
    """Apply PyTorch's *CUDA* autocast rules on a machine without a GPU.

    Inside the block, new tensors are *fake* CUDA tensors (``FakeTensorMode`` with default device "cuda"): they
    carry a dtype, shape and device but no data, and no GPU kernel runs. Autocast for "cuda" is switched on
    directly (``torch.amp.autocast("cuda")`` disables itself when no GPU is present), so every op goes through
    the CUDA autocast dispatch rules of the installed PyTorch: you can read the resulting dtypes, and ops that
    CUDA autocast refuses raise their real error. Nothing about speed or memory can be learned this way.

    Create the model and inputs inside the block; results are fake tensors (use ``.dtype``, ``.shape``).
    Raises :class:`SimulationUnavailable` where the private fake-tensor API is missing, and on a machine without a
    GPU under torch < 2.10, where some operations on fake CUDA tensors would call the real CUDA runtime.
    """
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"CUDA autocast runs in float16 or bfloat16, not {dtype}")
    fake_tensor_mode = _fake_tensor_mode()
    _check_fake_cuda_stays_off_the_runtime()
    enabled, previous_dtype = autocast_state("cuda")
    with fake_tensor_mode(), torch.device("cuda"):
        torch.set_autocast_dtype("cuda", dtype)
        torch.set_autocast_enabled("cuda", True)
        torch.autocast_increment_nesting()
        try:
            yield
        finally:
            if torch.autocast_decrement_nesting() == 0:
                torch.clear_autocast_cache()
            torch.set_autocast_enabled("cuda", enabled)
            torch.set_autocast_dtype("cuda", previous_dtype)


def cuda_simulation_available() -> tuple[bool, str]:
    """Whether :func:`simulated_cuda_autocast` works with the installed PyTorch: ``(True, "")``, or ``(False, why)``.

    Runs what the notebooks do in the simulation (build a layer, index a tensor, a linear layer, a softmax) and
    checks CUDA's rules: the layer's output is float16 on a (fake) CUDA device, the softmax float32.
    """
    try:
        with simulated_cuda_autocast(torch.float16):
            layer = nn.Linear(4, 4)  # weight initialisation goes through copy_
            hidden = layer(torch.ones(3, 4)[1:])  # indexing
            probabilities = torch.softmax(hidden, dim=1)
        got = (hidden.device.type, hidden.dtype, probabilities.dtype)
        if got != ("cuda", torch.float16, torch.float32):
            return False, (f"the simulation gave linear -> {hidden.dtype} on {hidden.device.type} and softmax -> "
                           f"{probabilities.dtype}, not CUDA's float16 on cuda and float32")
    except Exception as error:  # noqa: BLE001 - any failure means: skip the simulated CUDA parts
        return False, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return True, ""


def autocast_rule_devices(op: str) -> list[str] | None:
    """Devices ("CPU", "CUDA") for which the installed PyTorch registers an autocast kernel for ATen op ``op``
    (e.g. ``"conv2d"``, ``"softmax.int"``), read from the dispatcher; ``None`` where that private API
    (``torch._C._dispatch_dump``) is missing or fails. Raises ``ValueError`` for an op the dispatcher does not know."""
    try:
        dump = torch._C._dispatch_dump(f"aten::{op}")
    except Exception:  # noqa: BLE001 - private API: absent, renamed, or changed
        return None
    if not isinstance(dump, str):
        return None
    if not dump.strip():
        raise ValueError(f"the dispatcher knows no op aten::{op}")
    return [key for key in ("CPU", "CUDA") if re.search(rf"^Autocast{key}:", dump, re.M)]
