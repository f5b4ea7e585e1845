"""Solutions to notebook 02 (dtype-following tensors), computed with PyTorch."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..dtype_trace import record_ops


def bfloat16_plus_float16_dtype() -> torch.dtype:
    """02.1: the dtype of bfloat16 + float16 tensors (neither holds all values of the other)."""
    return (torch.ones(3, dtype=torch.bfloat16) + torch.ones(3, dtype=torch.float16)).dtype


def smallest_float32_that_overflows_fp16() -> float:
    """02.2: the smallest float32 value that becomes inf when converted to float16."""
    finite_max = torch.tensor(torch.finfo(torch.float16).max, dtype=torch.float32)
    steps = torch.arange(0, 2**14, dtype=torch.float64) * 2.0**-8  # float32 steps near 65504
    candidates = steps + float(finite_max)
    candidates = candidates.to(torch.float32)
    overflow = candidates.to(torch.float16).isinf()
    return float(candidates[overflow][0])


def wrong_positions_in_fp16_arange() -> int:
    """02.3: how many entries of torch.arange(4096, dtype=torch.float16) differ from their index
    (a 0-dim tensor of the count, as ``.sum()`` gives it, is accepted by ``check``)."""
    table = torch.arange(4096, dtype=torch.float16)
    return int((table.double() != torch.arange(4096).double()).sum())  # compared in float64


class AttentionPool(nn.Module):
    """02.4, repaired as 02 §5 teaches: padding replaced by the dtype's smallest finite value (never
    multiplied, never added), and a row with no token at all given zero weights (it pools to 0)."""

    def __init__(self, dim: int = 8):
        super().__init__()
        self.score = nn.Linear(dim, 1)
        self.register_buffer("big_negative", torch.tensor(-1e9))  # kept: the weights load the same

    def forward(self, features: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        scores = self.score(features).squeeze(-1)
        scores = scores.masked_fill(pad, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1).masked_fill(pad, 0)
        return (weights.unsqueeze(-1) * features).sum(dim=1)


def _seeded(pool_class: type, dtype: torch.dtype) -> nn.Module:
    with torch.random.fork_rng(devices=[]):  # the notebook's weights; the caller's generator kept
        torch.manual_seed(0)
        return pool_class().to(dtype)


def pool_inputs(flip_padding: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """02.4's check inputs: rows with 0, 2 and 5 padded positions and a FULLY padded row. Padded
    features push the scores far up (+-1000 along the score weights: padding would win if unmasked)
    and, in the empty row, far down (so an *added* finfo.min overflows to -inf there)."""
    features = 4 * torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(3))
    pad = torch.arange(6) >= torch.tensor([6, 4, 1, 0]).unsqueeze(1)
    direction = _seeded(AttentionPool, torch.float32).score.weight.detach()[0].sign()
    features[:3][pad[:3]] = (-1000 if flip_padding else 1000) * direction
    features[3] = -1000 * direction
    return features, pad


class _NegativeInfinity(TorchDispatchMode):
    """Notes whether any op run inside it returned a floating tensor holding -inf."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in tree_leaves(out):
            if isinstance(value, torch.Tensor) and value.is_floating_point() and not self.seen:
                self.seen = bool(value.isneginf().any())
        return out


class RepairedPool:
    """02.4's judge: the answer is the learner's repaired ``AttentionPool`` class, built with the
    notebook's weights, run in float16 and float32 on :func:`pool_inputs`, traced."""

    def why_not(self, answer: object) -> str | None:
        if not (isinstance(answer, type) and issubclass(answer, nn.Module)):
            return "the answer should be your repaired AttentionPool class itself"
        for dtype in (torch.float16, torch.float32):
            reason = self._why_not_in(answer, dtype)
            if reason is not None:
                return reason if dtype == torch.float16 else f"in float32, {reason}"
        return None

    @staticmethod
    def _why_not_in(answer: type, dtype: torch.dtype) -> str | None:
        features, pad = pool_inputs()
        flipped = pool_inputs(flip_padding=True)[0]
        model, solution = _seeded(answer, dtype), _seeded(AttentionPool, dtype)
        with torch.inference_mode():
            with _NegativeInfinity() as negative_infinity:  # below record_ops: its own ops stay unrecorded
                got, records = record_ops(lambda: model(features.to(dtype), pad))
            moved = model(flipped.to(dtype), pad)
            want = solution(features.to(dtype), pad)
        if got.shape != want.shape:
            return f"its output has shape {tuple(got.shape)}, not {tuple(want.shape)}"
        if any(len(set(record.input_dtypes)) > 1 for record in records):
            return (f"a tensor of another dtype mixes into the {str(dtype)[6:]} computation (a Python number times "
                    "the bool mask, pad * -1e9, is float32): build the mask from the scores, in their dtype, "
                    "as section 5 does; a cast of the result afterwards hides the leak, it does not remove it")
        if got.dtype != dtype:
            return (f"the {str(dtype)[6:]} module returns {str(got.dtype)[6:]}: a dtype is "
                    "hard-coded or a tensor of another dtype leaks in")
        if any(record.name == "nan_to_num" for record in records):
            return "nan_to_num hides the NaN instead of removing its cause"
        if not got[:3].isfinite().all():
            return "rows with real tokens still give NaN or inf"
        if negative_infinity.seen:
            return ("a score became -inf (a -inf fill, or an added finfo.min that overflowed): section 5 replaces "
                    "the padded scores with torch.finfo(dtype).min, never -inf")
        # a softmax-weighted mean of features |x| <= ~16: a right repair is a few roundings away
        tol = 8 * torch.finfo(dtype).eps * 16
        if not torch.allclose(moved[:3].float(), got[:3].float(), rtol=0, atol=tol):
            return "changing the padded features changes the output: the padding is not ignored"
        if not torch.allclose(got[:3].float(), want[:3].float(), rtol=0, atol=tol):
            return "partly padded rows are not the softmax-weighted mean of their real tokens"
        if not got[3].isfinite().all():
            return "a fully padded row still gives NaN"
        if got[3].abs().max() != 0:
            return ("a fully padded row still averages its padding (section 5: give a row with "
                    "no token zero weights)")
        return None

    def __repr__(self) -> str:
        return "an AttentionPool class whose float16 pooling ignores the padding"


SOLUTIONS = {
    "02.1": bfloat16_plus_float16_dtype,
    "02.2": smallest_float32_that_overflows_fp16,
    "02.3": wrong_positions_in_fp16_arange,
    "02.4": RepairedPool,
}

# 02.2 is about precision: 65519.996 is not the answer (it converts to the finite 65504): exact.
TOLERANCES = {"02.2": 0.0}
