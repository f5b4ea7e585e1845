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


def falling_losses(n: int, seed: int) -> torch.Tensor:
    """``n`` float16 losses falling from about 4 to 1.2 as a training run's do, with noise: a mean of
    chunk means weighs the short last chunk (the lowest losses) like a full one and misses."""
    generator = torch.Generator().manual_seed(seed)
    steps = torch.linspace(0, 1, n)
    return (1.2 + 2.8 * torch.exp(-5 * steps) + 0.1 * torch.randn(n, generator=generator)).half()


def mean_of_chunk_means(losses: torch.Tensor, chunk: int) -> float:
    """The mean of the means of consecutive chunks of ``chunk`` losses (the last one shorter)."""
    return torch.stack([part.double().mean() for part in losses.split(chunk)]).mean().item()


def _chunked(got: float, losses: torch.Tensor) -> bool:
    """Whether ``got`` is a mean of chunk means for a chunk size a learner might pick."""
    n = len(losses)
    sizes = set(range(2, min(n, 257))) | {c for c in (500, 512, 1000, 1024, 2000, 2048, 4096, 5000) if c < n}
    return any(n % chunk and math.isclose(got, mean_of_chunk_means(losses, chunk), rel_tol=2**-10)
               for chunk in sorted(sizes))


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


def _float16_total_of_shares(losses: torch.Tensor) -> float:
    """Each loss divided by the count first, then added to a float16 running total."""
    total = torch.zeros((), dtype=torch.float16)
    for loss in losses / len(losses):
        total = total + loss
    return total.item()


def _float16_running_update(losses: torch.Tensor) -> float:
    """A running mean kept in float16: mean += (loss - mean) / i."""
    mean = torch.zeros((), dtype=torch.float16)
    for i, loss in enumerate(losses, start=1):
        mean = mean + (loss - mean) / i
    return mean.item()


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
    if len(losses) > 2048 and math.isclose(got, _float16_total_of_shares(losses), rel_tol=2**-9):
        return (f"it returns {got:.4g}, not their mean {mean:.4g}: dividing each loss first does not help, "
                "a float16 running total still stalls once each addition is below half its spacing "
                "(section 8)")
    if len(losses) > 2048 and math.isclose(got, _float16_running_update(losses), rel_tol=2**-9):
        return (f"it returns {got:.4g}, not their mean {mean:.4g}: a running mean kept in float16 stops "
                "moving once (loss - mean) / i is below half of float16's spacing near the mean")
    if _chunked(got, losses):
        return (f"it returns {got:.4g}, not their mean {mean:.4g}: a mean of chunk means counts the short "
                f"last chunk ({len(losses)} does not divide evenly) as much as a full one; add the chunks' "
                "sums, then divide by the count")
    return f"it returns {got:.4g}, not their mean {mean:.4g}"


class RepairedMean:
    """00.4's judge: the answer is the learner's repaired function, run on the notebook's losses, on
    skewed ones (mean 2, median 1.25: the median fails), on seven losses (n - 1 and a typed
    10,000 fail) and on falling losses of 101, 1,009 and 10,007 (primes: a mean of chunk means
    fails for every chunk size up to 1,111 and every round one) against the float64 mean. A
    float16 result is two roundings of at most 2**-11 (torch.sum's output, the division): 2**-9
    accepts every correct fix; a typed number, the stalled float16 running sum, the median or a
    wrong count cannot pass, and the feedback names which it was."""

    def why_not(self, answer: object) -> str | None:
        if not callable(answer):
            return "the answer should be your repaired function itself (answer_4 = mean_of)"
        skewed = 0.5 + 6 * torch.rand(10_000, generator=torch.Generator().manual_seed(1)) ** 3
        inputs = (("the notebook's losses", logged_losses()), ("10,000 other float16 losses", skewed.half()),
                  ("seven float16 losses", torch.tensor(SHORT_LOG).half()),
                  *((f"{n:,} falling float16 losses", falling_losses(n, seed))
                    for n, seed in ((101, 3), (1009, 4), (10_007, 2))))
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
