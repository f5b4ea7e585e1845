"""Where inf and NaN first appear: per module (forward hooks) and per ATen op (notebook 07)."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from .dtype_trace import OpObserver


def _floats(values: Any) -> list[torch.Tensor]:  # the floating tensors, nested containers too
    return [v for v in tree_leaves(values) if isinstance(v, torch.Tensor) and v.is_floating_point()]


def all_finite(values: Any) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in _floats(values))


def nonfinite_kind(values: Any) -> str:
    """'nan', 'inf' or 'finite': the worst kind in ``values``."""
    tensors = _floats(values)
    return "nan" if any(bool(t.isnan().any()) for t in tensors) else \
        "inf" if any(bool(t.isinf().any()) for t in tensors) else "finite"


@dataclass(frozen=True)
class FirstNonFinite:
    """Where the first inf/NaN appeared: module or op name, what it made, from what inputs."""

    name: str              # module path such as "blocks.0.attention", or ATen op such as "exp"
    kind: str              # "inf" or "nan"
    inputs_finite: bool    # True: this is where it was *made*; False: it arrived from before
    dtype: torch.dtype     # dtype of the first floating output

    def __str__(self) -> str:
        origin = "from finite inputs" if self.inputs_finite else "(inputs already non-finite)"
        return f"{self.name} produced {self.kind} in {str(self.dtype)[6:]} {origin}"


def first_nonfinite_module(model: nn.Module, *inputs: Any) -> FirstNonFinite | None:
    """The first submodule to *finish* with inf/NaN in ``model(*inputs)`` (hooks); 07 §3."""
    found: list[FirstNonFinite] = []

    def hook(name: str) -> Callable:
        def check(module: nn.Module, args: Any, output: Any) -> None:
            if not found and not all_finite(output):
                found.append(FirstNonFinite(name or type(module).__name__, nonfinite_kind(output),
                                            all_finite(args), _floats(output)[0].dtype))
        return check

    handles = [module.register_forward_hook(hook(name)) for name, module in model.named_modules()]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return found[0] if found else None


def first_nonfinite_op(fn: Callable[[], Any]) -> tuple[Any, FirstNonFinite | None]:
    """``fn()``'s result and the first ATen op that made inf/NaN (or None), backward too; 07 §3."""
    found: list[FirstNonFinite] = []

    def seen(func, args: tuple, kwargs: dict, out: Any) -> None:
        if not found and not all_finite(out):
            found.append(FirstNonFinite(func.overloadpacket.__name__, nonfinite_kind(out),
                                        all_finite((args, kwargs)), _floats(out)[0].dtype))

    with OpObserver(seen):
        result = fn()
    return result, found[0] if found else None
