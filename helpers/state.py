"""Snapshots of model or optimizer state, bit-exact comparisons: notebooks 04 and 06."""

import torch
from torch import nn

from .formats import _INT_VIEW


def snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of every parameter and buffer of ``module`` (its ``state_dict``, cloned)."""
    return {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bits (NaN equals itself, ``-0.0`` differs from ``0.0``: not equal)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        view = _INT_VIEW[a.element_size() * 8]
        return torch.equal(a.contiguous().view(view), b.contiguous().view(view))
    return torch.equal(a, b)


def same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Whether two state dicts (from :func:`snapshot`) hold the same names and identical bits."""
    return a.keys() == b.keys() and all(bitwise_equal(a[name], b[name]) for name in a)


def optimizer_snapshot(optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """A detached copy of the optimizer's state, keyed ``"<index>.<name>"``, entries tensors."""
    return {f"{index}.{name}": (value.detach().clone() if isinstance(value, torch.Tensor)
                                else torch.tensor(value))
            for index, state in optimizer.state_dict()["state"].items()
            for name, value in state.items()}


def changed(old: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> set[str]:
    """Names of the tensors whose dtype or any value differs between two state dicts."""
    return {name for name, tensor in new.items()
            if tensor.dtype != old[name].dtype or not torch.equal(tensor, old[name])}


def count_changes(model: nn.Module, names: set[str]) -> dict[str, str]:
    """How many of ``model``'s parameters and buffers are in ``names`` ("0 of 161", ...)."""
    parameters = {name for name, _ in model.named_parameters()}
    buffers = {name for name, _ in model.named_buffers()}
    return {"parameters changed": f"{len(names & parameters)} of {len(parameters)}",
            "buffers changed": f"{len(names & buffers)} of {len(buffers)}"}
