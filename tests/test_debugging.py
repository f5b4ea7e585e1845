"""helpers.debugging: the first inf/NaN per module (forward hooks) and per ATen op."""
import torch
from torch import nn

from helpers import debugging


def test_first_nonfinite_module_names_the_innermost_culprit():
    class Exp(nn.Module):
        def forward(self, x):
            return x.exp()

    model = nn.Sequential(nn.Identity(), Exp(), nn.Identity())
    found = debugging.first_nonfinite_module(model, torch.tensor([1.0, 12.0], dtype=torch.float16))
    assert (found.name, found.kind, found.inputs_finite, found.dtype) == ("1", "inf", True, torch.float16)
    assert "from finite inputs" in str(found)
    assert debugging.first_nonfinite_module(model, torch.tensor([1.0, 2.0], dtype=torch.float16)) is None
    assert all(not m._forward_hooks for m in model.modules()), "hooks must be removed"


def test_first_nonfinite_op_sees_inside_a_module_and_backward():
    x = torch.tensor([1.0, 12.0], dtype=torch.float16)
    result, found = debugging.first_nonfinite_op(lambda: (x.exp() - x.exp()).sum())
    assert found.name == "exp" and found.kind == "inf" and found.inputs_finite
    assert result.isnan()
    w = torch.tensor([3.0], requires_grad=True)
    loss = (w.to(torch.float16).float() * 1e5).sum()  # finite forward; the gradient 1e5 does not fit float16
    assert loss.isfinite()
    _, found = debugging.first_nonfinite_op(loss.backward)
    assert (found.name, found.kind, found.inputs_finite) == ("_to_copy", "inf", True)


def test_nonfinite_kind_prefers_nan():
    assert debugging.nonfinite_kind([torch.tensor([1.0]), torch.tensor([float("inf"), float("nan")])]) == "nan"
    assert debugging.nonfinite_kind(torch.tensor([float("-inf")])) == "inf"
    assert debugging.nonfinite_kind({"a": torch.ones(2), "b": torch.arange(3)}) == "finite"
