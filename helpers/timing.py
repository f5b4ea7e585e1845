"""The course's timing method, taught in notebook 01 §4 (its cells hold marked copies: tools/copies.py).

Two variants of one workload are timed in pairs: each round times the baseline and the candidate back to back,
in alternating order, so that a machine that speeds up or slows down affects both alike. The rounds give one
ratio each; the median is the figure, the rounds' range its spread, and the verdict is one of three words.
"""

import statistics
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import torch


class Comparison(NamedTuple):
    ratio: float  # median over rounds of baseline s / candidate s: above 1 the candidate is faster
    low: float  # the smallest round's ratio
    high: float  # the largest round's ratio
    verdict: str  # "faster", "slower" or "no clear difference"
    baseline_s: float  # median seconds per call of the baseline
    candidate_s: float  # median seconds per call of the candidate
    threads: int  # the CPU threads both ran on

    def __str__(self) -> str:
        return (f"{self.ratio:.2f}x ({self.verdict}; rounds {self.low:.2f}-{self.high:.2f}x, "
                f"{self.threads} threads)")


def synchronizer(device: str | torch.device) -> Callable[[], None]:
    """A function that waits for the device's queued work (a GPU runs asynchronously; a CPU
    needs none)."""
    kind = torch.device(device).type
    if kind == "cuda":
        return lambda: torch.cuda.synchronize(device)
    if kind == "mps":
        return torch.mps.synchronize
    return lambda: None


def seconds_per_call(fn: Callable[[], Any], calls: int, sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls


def verdict(ratios: list[float], margin: float) -> str:
    """Faster or slower only when the median clears the margin and the middle half of the rounds
    agree, on a machine steady enough that the middle half of the rounds lie within a factor
    of 2."""
    ordered = sorted(ratios)
    quarter = len(ordered) // 4
    lower_quartile = ordered[quarter]
    upper_quartile = ordered[-1 - quarter]
    median = statistics.median(ordered)
    if upper_quartile > 2 * lower_quartile:  # an unsteady machine: the rounds say little
        return "no clear difference"
    if median >= 1 + margin and lower_quartile > 1:
        return "faster"
    if median <= 1 / (1 + margin) and upper_quartile < 1:
        return "slower"
    return "no clear difference"


def calls_per_round(fn: Callable[[], Any], round_s: float, sync: Callable[[], None]) -> int:
    """How many calls fill one round: a warm-up call, then the median of three timed calls."""
    seconds_per_call(fn, 1, sync)  # warm-up: allocations, caches, lazy initialisation
    one_call = statistics.median(seconds_per_call(fn, 1, sync) for _ in range(3))
    return max(1, int(round_s / one_call))


def compare(baseline: Callable[[], Any], candidate: Callable[[], Any], *,
            threads: int | None = None, rounds: int = 7, round_s: float = 0.05, margin: float = 0.1,
            device: str | torch.device = "cpu") -> Comparison:
    """Time ``candidate`` against ``baseline`` in paired, interleaved rounds at ``threads``
    threads."""
    threads = threads or torch.get_num_threads()
    sync = synchronizer(device)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        calls_a = calls_per_round(baseline, round_s, sync)
        calls_b = calls_per_round(candidate, round_s, sync)
        times_a, times_b, ratios = [], [], []
        for i in range(rounds):
            if i % 2 == 0:
                a = seconds_per_call(baseline, calls_a, sync)
                b = seconds_per_call(candidate, calls_b, sync)
            else:
                b = seconds_per_call(candidate, calls_b, sync)
                a = seconds_per_call(baseline, calls_a, sync)
            times_a.append(a)
            times_b.append(b)
            ratios.append(a / b)
    finally:
        torch.set_num_threads(previous_threads)
    return Comparison(ratio=statistics.median(ratios), low=min(ratios), high=max(ratios),
                      verdict=verdict(ratios, margin), baseline_s=statistics.median(times_a),
                      candidate_s=statistics.median(times_b), threads=threads)
