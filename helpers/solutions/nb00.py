"""Solutions to notebook 00's exercises, computed with PyTorch."""
import math

import torch

from ..formats import format_facts, spacing
from ..nb00 import logged_losses


def _bf16_running_sum_of_ones() -> float:
    total = torch.zeros((), dtype=torch.bfloat16)
    for _ in range(1000):
        total = total + 1
    return total.item()


SHORT_LOG = (2.1, 2.5, 1.9, 2.3, 2.2, 2.8, 2.0)  # seven losses: a count that is not 10,000


def _divided_wrongly(got: float, losses: torch.Tensor) -> str | None:
    """What a wrong denominator gives away: n - 1 (a variance's), or a count typed in."""
    total, n = losses.double().sum().item(), len(losses)
    if math.isclose(got, total / (n - 1), rel_tol=2**-9):
        return f"it divides by n - 1 ({n - 1}): a mean divides the sum by the count, n"
    if n != 10_000 and math.isclose(got, total / 10_000, rel_tol=2**-9):
        return "it divides by 10,000 whatever the count: divide by len(losses)"
    return None


def _float16_running_mean(losses: torch.Tensor) -> float:
    """The exercise's code as given: a running total kept in float16, divided by the count."""
    total = torch.zeros((), dtype=torch.float16)
    for loss in losses:
        total = total + loss
    return (total / len(losses)).item()


def _wrong_cause(got: float, losses: torch.Tensor) -> str:
    """What a wrong result gives away: a wrong count, the median, or the stalled float16 total."""
    mean = losses.double().mean().item()
    median = losses.double().median().item()  # the lower middle value, as torch computes it
    middle = losses.double().sort().values[len(losses) // 2].item()  # the upper one (statistics.median: between)
    if _divided_wrongly(got, losses):
        return _divided_wrongly(got, losses)
    if min(median, middle) * (1 - 2**-9) <= got <= max(median, middle) * (1 + 2**-9):
        return f"it returns their median ({got:.4g}), not their mean ({mean:.4g})"
    if len(losses) > 2048 and math.isclose(got, _float16_running_mean(losses), rel_tol=2**-9):
        return f"it returns {got:.4g}, not their mean {mean:.4g}: a float16 running total stalls (section 8)"
    return f"it returns {got:.4g}, not their mean {mean:.4g}"


class RepairedMean:
    """00.4's judge: the answer is the learner's repaired function, run on the notebook's losses, on
    skewed ones (mean 2, median 1.25: the median fails) and on seven losses (n - 1 and a typed
    10,000 fail) against the float64 mean. A float16 result is two roundings of at most 2**-11
    (torch.sum's output, the division): 2**-9 accepts every correct fix; a typed number, the
    stalled float16 running sum, the median or a wrong count cannot pass, and the feedback names
    which it was."""

    def why_not(self, answer: object) -> str | None:
        if not callable(answer):
            return "the answer should be your repaired function itself (answer_4 = mean_of)"
        skewed = 0.5 + 6 * torch.rand(10_000, generator=torch.Generator().manual_seed(1)) ** 3
        inputs = (("the notebook's losses", logged_losses()), ("10,000 other float16 losses", skewed.half()),
                  ("seven float16 losses", torch.tensor(SHORT_LOG).half()))
        results = []
        for _name, losses in inputs:
            got = answer(losses.clone())
            if not isinstance(got, (int, float, torch.Tensor)) or (
                    isinstance(got, torch.Tensor) and got.numel() != 1):
                return f"it should return one number, not {type(got).__name__}"
            results.append(float(got))
        if len(set(results)) == 1:
            return (f"it returns {results[0]:.4g} whatever the losses (their means differ): compute the "
                    "mean from the losses it is given")
        for (name, losses), got in zip(inputs, results):
            if not math.isclose(got, losses.double().mean().item(), rel_tol=2**-9):
                return f"on {name} {_wrong_cause(got, losses)}"
        return None

    def __repr__(self) -> str:
        return "a function returning the mean of any float16 losses"


SOLUTIONS = {
    # 00.1: where does a running bfloat16 sum of ones stop growing?
    "00.1": _bf16_running_sum_of_ones,
    # 00.2: the gap between consecutive float16 numbers between 1024 and 2048
    "00.2": lambda: spacing(1500.0, torch.float16).item(),
    # 00.3: the smallest positive float16 number
    "00.3": lambda: format_facts(torch.float16).smallest_subnormal,
    # 00.4 (fix the code): a function that averages float16 losses, which a float16 running sum
    # gets wrong: judged by running it
    "00.4": RepairedMean,
}

# 00.3 is printed rounded to three digits (5.96e-08): accept that.
TOLERANCES = {"00.3": 1e-3}
