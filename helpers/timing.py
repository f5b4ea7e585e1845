"""The course's timing method, taught in notebook 01 §4 (its cells hold this same code).

Two variants of one workload are timed in pairs: each round times the baseline and the candidate
back to back, in alternating order, so that a machine that speeds up or slows down affects both
alike. Each round gives one ratio. The figure is the median of the rounds' ratios; its interval is
the order-statistic interval (the sign test turned around): the k-th smallest and the k-th largest
of n ratios bound the median with a probability that depends only on n and k. The rounds are looked
at after 8, 16 and 24 rounds, and the comparison stops at the first look that decides; the looks
share one error budget, so the verdict's error rate is known.
"""

import functools
import math
import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

LOOKS = (8, 16, 24)  # rounds after which the comparison looks at its interval
ERROR = 0.02  # at most this often "faster" or "slower" when there is no true difference
MAX_SIGMA = 0.3  # a wider spread of the rounds' log-ratios: "too busy to tell"
FINDINGS_ERROR = 0.05  # at most this often a notebook's run prints any false agreement or finding


class Comparison(NamedTuple):
    ratio: float  # median over rounds of baseline s / candidate s: above 1 the candidate is faster
    low: float  # the interval of that median: the k-th smallest round's ratio
    high: float  # ... and the k-th largest
    verdict: str  # "faster", "slower", "no clear difference" or "too busy to tell"
    baseline_s: float  # median seconds per call of the baseline, over the same rounds
    candidate_s: float  # median seconds per call of the candidate, over the same rounds
    threads: int  # the CPU threads both ran on
    rounds: int = 0  # rounds timed: one of LOOKS
    coverage: float = 0.0  # how often an interval built this way holds the true median
    error: float = 0.0  # the bound, over all looks, on a false "faster" or "slower"
    sigma: float = 0.0  # standard deviation of the rounds' log-ratios: the machine's noise
    load: float | None = None  # the 1-minute load average when it finished (None: not available)
    ratios: tuple[float, ...] = ()  # every round's ratio, in the order timed

    def __str__(self) -> str:
        load = "n/a" if self.load is None else f"{self.load:.1f}"
        return (f"{self.ratio:.2f}x ({self.verdict}; median between {self.low:.2f}x and "
                f"{self.high:.2f}x, {self.rounds} rounds, {self.threads} threads, load {load})")


def synchronizer(device: str | torch.device) -> Callable[[], None]:
    """A function that waits for the device's queued work (a GPU runs asynchronously; a CPU needs
    none)."""
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


def calls_per_round(fn: Callable[[], Any], round_s: float, sync: Callable[[], None]) -> int:
    """How many calls fill one round: a warm-up call, then the median of three timed calls."""
    seconds_per_call(fn, 1, sync)  # warm-up: allocations, caches, lazy initialisation
    one_call = statistics.median(seconds_per_call(fn, 1, sync) for _ in range(3))
    return max(1, int(round_s / one_call))


@functools.cache
def at_most(k: int, n: int) -> float:
    """P(at most k of n rounds fall below the median) = BinomCDF(k; n, 1/2)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2**n


@functools.cache
def ranks(error: float, sides: int = 2) -> tuple[tuple[int, int], ...]:
    """``(n, k)`` per look: the k-th smallest and k-th largest of n rounds bound the median.
    Each look takes the widest interval whose chance of missing the median fits in what earlier
    looks left of ``error``; k = 0: nothing fits, that look cannot decide. ``sides=1``: a miss
    on one chosen side only."""
    left = error
    schedule = []
    for n in LOOKS:
        k = 0
        while k < n // 2 and sides * at_most(k, n) <= left:
            k += 1
        if k > 0:
            left -= sides * at_most(k - 1, n)
        schedule.append((n, k))
    return tuple(schedule)


def spent(error: float, sides: int = 2) -> float:
    """What the looks of :func:`ranks` use of ``error``, together: the bound on a false verdict."""
    return sum(sides * at_most(k - 1, n) for n, k in ranks(error, sides) if k > 0)


def spread(ratios: list[float]) -> float:
    """Standard deviation of the log-ratios: 0.2 means rounds typically differ by about 20 %."""
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / len(logs)
    return math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))


class Decision(NamedTuple):
    verdict: str
    rounds: int
    low: float
    high: float
    coverage: float


def decide(ratios: list[float], margin: float, error: float = ERROR) -> Decision:
    """The looks that ``ratios`` reach, in order; the first whose interval excludes 1x, with a
    median that clears the margin, decides. Undecided after the last look, a spread over MAX_SIGMA
    is too busy to tell."""
    decision = Decision("no clear difference", len(ratios), 0.0, math.inf, 0.0)
    for n, k in ranks(error):
        if n > len(ratios):
            break
        ordered = sorted(ratios[:n])
        median = statistics.median(ordered)
        low, high = (ordered[k - 1], ordered[-k]) if k > 0 else (0.0, math.inf)
        coverage = 1 - 2 * at_most(k - 1, n) if k > 0 else 0.0
        if low > 1 and median >= 1 + margin:
            return Decision("faster", n, low, high, coverage)
        if high < 1 and median <= 1 / (1 + margin):
            return Decision("slower", n, low, high, coverage)
        decision = Decision("no clear difference", n, low, high, coverage)
    if spread(ratios[:decision.rounds]) > MAX_SIGMA:
        return decision._replace(verdict="too busy to tell")
    return decision


def load_average() -> float | None:
    """The 1-minute load average (processes running or waiting), where the system reports one."""
    if not hasattr(os, "getloadavg"):
        return None
    return os.getloadavg()[0]


def paired_round(index: int, baseline: Callable[[], Any], candidate: Callable[[], Any],
                 calls: tuple[int, int], sync: Callable[[], None]) -> tuple[float, float]:
    """Seconds per call of baseline and candidate, back to back: even rounds baseline first."""
    if index % 2 == 0:
        a = seconds_per_call(baseline, calls[0], sync)
        b = seconds_per_call(candidate, calls[1], sync)
    else:
        b = seconds_per_call(candidate, calls[1], sync)
        a = seconds_per_call(baseline, calls[0], sync)
    return a, b


def compare(baseline: Callable[[], Any], candidate: Callable[[], Any], *,
            threads: int | None = None, round_s: float = 0.05, margin: float = 0.1,
            device: str | torch.device = "cpu", error: float = ERROR,
            rounds: int | None = None) -> Comparison:
    """Time ``candidate`` against ``baseline`` in paired, interleaved rounds at ``threads`` threads,
    looking after each of LOOKS rounds. ``rounds`` is ignored (older callers pass it; the looks
    decide)."""
    threads = threads or torch.get_num_threads()
    sync = synchronizer(device)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        calls = (calls_per_round(baseline, round_s, sync),
                 calls_per_round(candidate, round_s, sync))
        times_a, times_b, ratios = [], [], []
        for look in LOOKS:
            while len(ratios) < look:
                a, b = paired_round(len(ratios), baseline, candidate, calls, sync)
                times_a.append(a)
                times_b.append(b)
                ratios.append(a / b)
            decision = decide(ratios, margin, error)
            if decision.verdict in ("faster", "slower"):
                break
    finally:
        torch.set_num_threads(previous_threads)
    return Comparison(ratio=statistics.median(ratios), low=decision.low, high=decision.high,
                      verdict=decision.verdict, baseline_s=statistics.median(times_a),
                      candidate_s=statistics.median(times_b), threads=threads,
                      rounds=len(ratios), coverage=decision.coverage, error=spent(error),
                      sigma=spread(ratios), load=load_average(), ratios=tuple(ratios))


def simulated_ratios(rng: random.Random, true_ratio: float, sigma: float) -> list[float]:
    """One comparison's rounds, made up: log-normal ratios around ``true_ratio``, spread
    ``sigma``."""
    return [math.exp(rng.gauss(math.log(true_ratio), sigma)) for _ in range(LOOKS[-1])]


def verdict_rates(true_ratio: float, sigma: float, trials: int = 2000, seed: int = 0,
                  margin: float = 0.1, error: float = ERROR) -> dict[str, float]:
    """How often :func:`decide` gives each verdict on simulated rounds (no timing: ratios drawn at
    random)."""
    rng = random.Random(seed)
    counts = dict.fromkeys(("faster", "slower", "no clear difference", "too busy to tell"), 0)
    for _ in range(trials):
        counts[decide(simulated_ratios(rng, true_ratio, sigma), margin, error).verdict] += 1
    return {verdict: count / trials for verdict, count in counts.items()}


def false_verdict_rate(sigma: float, trials: int = 2000, seed: int = 0) -> float:
    """Simulated: how often a workload compared with itself, rounds spread by ``sigma``, is
    called faster or slower."""
    rates = verdict_rates(1.0, sigma, trials, seed)
    return rates["faster"] + rates["slower"]


def shared_error(verdicts: int) -> float:
    """The ``error`` to pass :func:`compare` so that its interval is the one :func:`against_rule`
    uses in a notebook that prints ``verdicts`` such lines."""
    return min(ERROR, 2 * FINDINGS_ERROR / verdicts)


def expected_range(expected: str | tuple[float, float], margin: float) -> tuple[float, float, str]:
    """What the rule expects, as a range of ratios, and in words."""
    if expected == "faster":
        return 1.0, math.inf, "faster"
    if expected == "slower":
        return 0.0, 1.0, "slower"
    if expected == "no gain":
        return 0.0, 1 + margin, f"no gain (under {1 + margin:.2f}x)"
    low, high = expected
    if high == math.inf:
        return low, high, f"above {low:.2f}x"
    if low <= 0:
        return low, high, f"below {high:.2f}x"
    return low, high, f"{low:.2f}-{high:.2f}x"


def claim_interval(result: Comparison, level: float) -> tuple[float, float] | None:
    """The interval of the median with at most ``level`` chance of missing it on either chosen
    side: the comparison's own if it is at least that strict, else one recomputed from its rounds
    over the same looks; None when that many rounds cannot reach ``level``."""
    if result.error / 2 <= level:
        return result.low, result.high
    for n, k in ranks(level, sides=1):
        if n == result.rounds and k > 0:
            ordered = sorted(result.ratios)
            return ordered[k - 1], ordered[-k]
    return None


def against_rule(result: Comparison, expected: str | tuple[float, float], *, verdicts: int,
                 error: float = FINDINGS_ERROR, margin: float = 0.1, rule: str = "") -> str:
    """Whether ``result`` agrees with what the rule expects: agrees when the interval lies inside
    the expected range, a finding when it lies wholly outside, borderline otherwise. Each of a
    notebook's ``verdicts`` such lines may err ``error / verdicts``, so the notebook's lines
    together err at most ``error``."""
    low_expected, high_expected, what = expected_range(expected, margin)
    interval = claim_interval(result, error / verdicts)
    if interval is None:
        return (f"borderline (too few rounds for this notebook's error rate): "
                f"the rule{rule} expects {what}")
    low, high = interval
    between = f"median between {low:.2f}x and {high:.2f}x"
    if low_expected < low and high < high_expected:
        return f"agrees with the rule{rule}: expected {what}; {between}"
    if high < low_expected or low > high_expected:
        return f"finding: disagrees with the rule{rule}: expected {what}; {between}"
    return f"borderline (interval {low:.2f}-{high:.2f}x): the rule{rule} expects {what}"
