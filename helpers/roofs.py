"""The machine's roofs, measured (notebook 00 §2), and where a timed kernel lies under them.

Compute: a square GEMM per dtype, its size chosen by time (an emulated float16 GEMM runs a thousand
times slower than a native one, so a fixed n would take seconds or nothing). Bandwidth: one
streaming read (``.sum()``) of a tensor past the last-level cache. Both are the best of a few
calls: a roof is what the machine can do, not what it did on average. Notebooks 03, 06, 08 and 09
place their timed kernels against these roofs and print a reason for a speed ratio only when the
measured fractions support it (:func:`reason`).
"""

from dataclasses import dataclass

import torch

from . import timing
from .device import last_level_cache_bytes

CALL_S = 0.004  # a roof's GEMM grows (n doubles from 128) until one call takes this long
MAX_N = 2048
FAR_BELOW = 0.5  # a kernel under this fraction of its roof "runs far below its roof"
STREAM_CAP = 256 << 20  # the most bytes the streaming read holds


def name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def best_seconds(fn, device: str | torch.device = "cpu", calls: int = 3,
                 min_s: float = 0.005) -> float:
    """The fastest of ``calls`` timed runs after a warm-up, each run repeating ``fn`` for at least
    ``min_s`` (a roof is the best a kernel does; speed ratios use :func:`timing.compare`)."""
    sync = timing.synchronizer(device)
    once = timing.seconds_per_call(fn, 1, sync)  # the warm-up, and how long one call takes
    repeat = max(1, int(min_s / once))
    return min(timing.seconds_per_call(fn, repeat, sync) for _ in range(calls))


def gemm_rate(dtype: torch.dtype, device: str | torch.device = "cpu") -> tuple[float, int]:
    """(FLOP/s, n) of the fastest n x n @ n x n GEMM in ``dtype``, n sized by :data:`CALL_S`."""
    sync = timing.synchronizer(device)
    n = 128
    while True:
        a = torch.ones(n, n, device=device, dtype=dtype)
        c = torch.empty(n, n, device=device, dtype=dtype)
        timing.seconds_per_call(lambda: torch.mm(a, a, out=c), 1, sync)  # warm-up
        one_call = min(timing.seconds_per_call(lambda: torch.mm(a, a, out=c), 1, sync)
                       for _ in range(3))  # the least disturbed of three calls
        if one_call >= CALL_S or n >= MAX_N:
            break
        n *= 2
    seconds = best_seconds(lambda: torch.mm(a, a, out=c), device, min_s=CALL_S)
    return 2 * n**3 / seconds, n


def read_rate(device: str | torch.device = "cpu") -> tuple[float, int]:
    """(bytes/s, bytes) of the fastest ``.sum()`` of a float32 tensor 2x the last-level cache."""
    nbytes = min(2 * last_level_cache_bytes(), STREAM_CAP)
    if torch.device(device).type != "cpu":
        nbytes = STREAM_CAP  # past any GPU's L2
    x = torch.ones(nbytes // 4, device=device)
    return nbytes / best_seconds(lambda: x.sum(), device), nbytes


@dataclass(frozen=True)
class Roofs:
    """FLOP/s of a GEMM per dtype name, bytes/s of a streaming read, at ``threads`` threads."""
    compute: dict[str, float]
    gemm_n: dict[str, int]
    bandwidth: float
    threads: int

    def ridge(self, dtype: str) -> float:
        """FLOPs per byte where the two roofs meet."""
        return self.compute[dtype] / self.bandwidth

    def roof(self, dtype: str, intensity: float) -> float:
        """The most FLOP/s a kernel of ``intensity`` FLOPs per byte can reach in ``dtype``."""
        return min(self.compute[dtype], intensity * self.bandwidth)

    def __str__(self) -> str:
        lines = [f"streaming read: {self.bandwidth / 1e9:.1f} GB/s ({self.threads} threads)"]
        lines += [f"{d:>9} GEMM (n={self.gemm_n[d]}): {self.compute[d] / 1e9:7.1f} GFLOP/s, ridge "
                  f"at {self.ridge(d):6.2f} FLOP/byte" for d in self.compute]
        return "\n".join(lines)


def measure(dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16),
            device: str | torch.device = "cpu", threads: int | None = None) -> Roofs:
    """This machine's roofs at ``threads`` threads (default: as set), float32 kept strict."""
    from .device import strict_fp32
    threads = threads or torch.get_num_threads()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with strict_fp32():
            gemms = {name(d): gemm_rate(d, device) for d in dtypes}
        bandwidth, _ = read_rate(device)
    finally:
        torch.set_num_threads(previous)
    return Roofs({d: r for d, (r, _) in gemms.items()}, {d: n for d, (_, n) in gemms.items()},
                 bandwidth, threads)


@dataclass(frozen=True)
class Kernel:
    """One timed call: its dtype name, FLOPs, bytes it must move at least, seconds per call."""
    dtype: str
    flops: float
    nbytes: float
    seconds: float

    @property
    def intensity(self) -> float:
        return self.flops / self.nbytes

    def fraction(self, roofs: Roofs) -> float:
        """Achieved FLOP/s over the roof at this kernel's intensity."""
        return self.flops / self.seconds / roofs.roof(self.dtype, self.intensity)

    def describe(self, roofs: Roofs) -> str:
        side = "memory" if self.intensity < roofs.ridge(self.dtype) else "compute"
        share = self.fraction(roofs)
        far = " (far below it)" if share < FAR_BELOW else ""
        return (f"{self.dtype} {self.seconds * 1e3:.2f} ms: {self.flops / self.seconds / 1e9:.1f} "
                f"GFLOP/s, {self.nbytes / self.seconds / 1e9:.1f} GB/s, "
                f"{share:.0%} of its {side} roof{far}")


def reason(result, baseline: Kernel, candidate: Kernel, roofs: Roofs) -> str:
    """Why ``result`` (a :class:`timing.Comparison`, baseline = float32) came out as it did, from
    each kernel's fraction of its roof; "unexplained here" where the fractions do not say."""
    if result.verdict not in ("faster", "slower"):
        return f"no reason given: {result.verdict}"
    base, cand = baseline.fraction(roofs), candidate.fraction(roofs)
    allowed = (roofs.roof(candidate.dtype, candidate.intensity)
               / roofs.roof(baseline.dtype, baseline.intensity))
    numbers = (f"the roofs allow {allowed:.2f}x; {baseline.dtype} at {base:.0%} of its roof, "
               f"{candidate.dtype} at {cand:.0%} of its")
    if max(base, cand) > 1.2:
        return f"unexplained here ({numbers}: a kernel above the roof the GEMM measured)"
    if result.low <= allowed <= result.high:
        return f"as the roofs predict ({numbers})"
    if result.low > allowed and base < FAR_BELOW:
        return (f"more than the roofs allow: this float32 kernel runs far below its roof "
                f"({numbers})")
    if result.high < allowed and cand < FAR_BELOW:
        return (f"less than the roofs allow: the {candidate.dtype} kernel runs far below its "
                f"roof ({numbers})")
    return f"unexplained here ({numbers})"


def expected_by_rule(advice, dtype: torch.dtype, how: str = "") -> str | None:
    """What the rule's :class:`helpers.precision.Advice` expects of ``dtype`` used as ``how``
    ("autocast", "16-bit weights"; "" for either) against float32, as
    :func:`helpers.timing.against_rule` takes it: "faster" for its pick, "no gain" where it
    advises float32; None where it leaves the case to measurement or picks another variant."""
    if advice.how == "float32":
        return "no gain"
    if advice.how == "measure" or advice.dtype != dtype or not advice.how.startswith(how):
        return None
    return "faster"


def fraction_line(kernels: list[Kernel], roofs: Roofs) -> str:
    """One kernel per line, "; "-joined: time, GFLOP/s, GB/s, fraction of its roof."""
    return "; ".join(k.describe(roofs) for k in kernels)

