"""Solutions to notebook 07's exercises, computed with PyTorch (the notebook's model, rebuilt here).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..debugging import first_nonfinite_op
from ..dtype_trace import record_ops


class Attention(nn.Module):
    """Notebook 07's attention: dot-product scores without the 1/sqrt(d) factor."""

    def __init__(self, d: int):
        super().__init__()
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        return self.query(x) @ self.key(x).transpose(-2, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.scores(x), dim=-1) @ self.value(x)


class IslandAttention(Attention):
    """The fix of exercise 07.1: scores and softmax in float32, back to the input's dtype for the
    values."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k = self.query(x).float(), self.key(x).float()
        weights = torch.softmax(q @ k.transpose(-2, -1), dim=-1).to(x.dtype)
        return weights @ self.value(x)


class SensorModel(nn.Module):
    def __init__(self, d: int = 128, attention: type = Attention):
        super().__init__()
        self.embed = nn.Linear(16, d)
        self.attention = attention(d)
        self.head = nn.Linear(d, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.attention(self.embed(x)).mean(dim=1))


def data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw readings (0 to 500), then normalised inputs and labels (one generator): seed 0 gives the
    notebook's sections 2 and 4; the judge of 07.1 uses seed 1."""
    generator = torch.Generator().manual_seed(seed)
    readings = torch.rand(8, 32, 16, generator=generator) * 500
    inputs = torch.rand(8, 32, 16, generator=generator)
    labels = torch.randint(0, 4, (8,), generator=generator)
    return readings, inputs, labels


def agreement(attention: type, seed: int = 0) -> int:
    """How many of the 8 predictions of the float16 model equal the float32 model's, on the raw
    readings."""
    readings, _, _ = data(seed)
    model = seeded_model(attention)
    with torch.inference_mode():
        predictions32 = model(readings).argmax(dim=1)
        predictions16 = model.half()(readings.half()).argmax(dim=1)
    return int((predictions16 == predictions32).sum())


def seeded_model(attention: type = Attention) -> nn.Module:
    """Section 2's model (seed 0) with ``attention``; the caller's random state is left alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return SensorModel(attention=attention).eval()


class IslandJudge:
    """07.1's judge: the answer is the learner's attention class, built into section 2's model and
    run on new raw readings (seed 1). It must keep Attention's float32 math (no 1/sqrt(d)), make no
    inf or NaN anywhere in float16 (a clamp or nan_to_num after an overflowing product fails), run
    the scores' product and the softmax in float32, and agree with float32 on all 8 predictions."""

    def why_not(self, answer: object) -> str | None:
        if not (isinstance(answer, type) and issubclass(answer, nn.Module)):
            return "answer_1 should be your repaired attention class itself (not an instance)"
        readings, inputs, _ = data(seed=1)
        try:
            reference, model = seeded_model(), seeded_model(answer)
            with torch.inference_mode():
                same_math = torch.allclose(model(inputs), reference(inputs), rtol=1e-4, atol=1e-5)
                model.half()
                (_, made), (_, ops) = (find(lambda: model(readings.half()))
                                       for find in (first_nonfinite_op, record_ops))
        except Exception as error:  # noqa: BLE001 - any error of the learner's class is feedback
            return f"the model raised {type(error).__name__}: {str(error).splitlines()[0]}"
        if not same_math:
            return "in float32 the class computes something else than Attention: keep the math " \
                "(no 1/sqrt(d)); only the dtype of the scores changes"
        if made is not None:
            return f"in float16 `{made.name}` still makes {made.kind} from finite inputs (a " \
                "clamp or nan_to_num would only hide it): compute the scores in float32"
        for names, what in ((("matmul", "bmm", "mm"), "the scores' product"),
                            (("softmax", "_softmax"), "softmax")):
            if not any(op.name in names and op.output_dtypes == (torch.float32,) for op in ops):
                return f"{what} does not run in float32: it belongs in the float32 island"
        agree = agreement(answer, seed=1)
        return None if agree == 8 else f"only {agree} of 8 float16 predictions agree with float32"

    def __repr__(self) -> str:
        return "an attention class with a float32 island, the same math as Attention"


def largest_finite_scale_exponent(batch: int = 64, start: int = 24) -> int:
    """The largest k <= start for which the first scaled float16-autocast backward pass of a fresh
    model on a normalised batch (generator seed 1) stays finite (CPU)."""
    generator = torch.Generator().manual_seed(1)
    inputs = torch.rand(batch, 32, 16, generator=generator)
    labels = torch.randint(0, 4, (batch,), generator=generator)
    model = seeded_model()
    for k in range(start, -1, -1):
        model.zero_grad()
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**k)
        with torch.amp.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(inputs), labels)
        if first_nonfinite_op(lambda: scaler.scale(loss).backward())[1] is None:
            return k
    raise AssertionError("no scale keeps the backward pass finite")


SOLUTIONS = {
    # 07.1 (fix the code): an attention class whose scores are a float32 island, judged by
    # building the model from it (outputs, a trace of its ops, agreement with float32 on 8 readings)
    "07.1": IslandJudge,
    # 07.2: largest exponent k of a loss scale 2**k keeping the first backward (batch 64) finite
    "07.2": largest_finite_scale_exponent,
}
