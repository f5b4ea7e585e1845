"""Solutions to notebook 09's exercises: a judge that runs the learner's repaired loop (09.1) and a
count made by PyTorch (09.2). Neither changes the learner's global random state."""
from __future__ import annotations

import torch

from .. import nb09 as lab


def unroll_once(cell: torch.nn.Linear, inputs: torch.Tensor) -> torch.Tensor:
    """Notebook 09 exercise 09.1: one autocast region around the whole loop."""
    hidden = torch.zeros(inputs.shape[1], cell.out_features)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for x in inputs:
            hidden = torch.tanh(cell(torch.cat([x, hidden], dim=-1)))
    return hidden


def _gradients(unroll, cell: torch.nn.Linear, inputs: torch.Tensor):
    """The gradients of the summed output with respect to the cell's weight and each input step."""
    inputs = inputs.clone().requires_grad_()
    unroll(cell, inputs).float().sum().backward()
    weight_grad = torch.zeros_like(cell.weight) if cell.weight.grad is None else cell.weight.grad
    input_grad = torch.zeros_like(inputs) if inputs.grad is None else inputs.grad
    return weight_grad, input_grad


class CastOnceJudge:
    """09.1: the repaired ``unroll(cell, inputs)`` casts the weight once, runs its matmuls in
    bfloat16, keeps float32 weights, gives the reference's output, and its gradient reaches the
    weight from every step of the sequence (no step skipped, no hidden state detached)."""

    def why_not(self, unroll) -> str | None:
        if not callable(unroll):
            return "pass the repaired function unroll itself"
        cell, inputs = lab.recurrent_setup()  # fresh: the learner's cell may have been changed
        expected = unroll_once(*lab.recurrent_setup())
        weight = tuple(cell.weight.shape)
        out = []
        try:
            dispatched = lab.ops(lambda: out.append(unroll(cell, inputs)))
        except Exception as error:  # noqa: BLE001 - the learner's code: report, don't crash
            return f"unroll(cell, inputs) raised {type(error).__name__}: {error}"
        dtypes = [dtype for name, _, dtype in dispatched if name in ("addmm", "mm", "linear")]
        cast_shapes = [shape for name, shape, _ in dispatched if name in ("_to_copy", "to")]
        out = out[0]
        if any(p.dtype != torch.float32 for p in cell.parameters()):
            return "the cell's weights are no longer float32 (autocast keeps float32 weights)"
        if not dtypes or any(d != torch.bfloat16 for d in dtypes):
            return "the cell's matmuls no longer run in bfloat16"
        if cast_shapes.count(weight) != 1:
            return f"the weight is cast {cast_shapes.count(weight)} times per call, not once"
        if not isinstance(out, torch.Tensor) or out.shape != expected.shape:
            return "unroll should return the last hidden state, shape (batch, width)"
        if not out.requires_grad:
            return "the output no longer carries gradients back to the weights"
        if not torch.allclose(out.float(), expected.float(), rtol=0, atol=2e-2):
            return "the hidden state differs from the loop's result"
        return self._why_not_gradients(unroll)

    def _why_not_gradients(self, unroll) -> str | None:
        weight_grad, input_grad = _gradients(unroll, *lab.recurrent_setup())
        expected, _ = _gradients(unroll_once, *lab.recurrent_setup())
        if weight_grad.abs().sum() == 0:
            return "no gradient reaches the cell's weight (was it cast under no_grad or detached?)"
        silent = [step for step, grad in enumerate(input_grad) if grad.abs().sum() == 0]
        if silent:
            return (f"steps {silent} of the sequence get no gradient: every step must count "
                    "(no step skipped, no hidden.detach())")
        if (weight_grad - expected).norm() > 0.05 * expected.norm():
            return "the weight's gradient differs from the loop's: every step must feed it"
        return None


def _casts_added_to_a_five_layer_step() -> int:
    steps = [lab.Step(lab.mlp(64, depth=5), dtype, lab.batch(16, 64))
             for dtype in (torch.bfloat16, None)]
    with_autocast, without = (len(lab.casts(step)) for step in steps)
    return with_autocast - without


SOLUTIONS = {"09.1": CastOnceJudge, "09.2": _casts_added_to_a_five_layer_step}
