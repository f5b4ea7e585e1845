"""The machine's roofs, measured (notebook 00 §2), and where a timed kernel lies under them.

Compute: a square GEMM per dtype the machine computes natively (float32, and the 16-bit dtypes
``helpers.precision.native_dtypes`` reads from the device's documented capabilities), its size
chosen by time, its operands random. A dtype the machine emulates has no roof: its speed is
whatever its conversion kernel does at that shape ("no roof here: the kernel decides").
Bandwidth: a streaming read (``.sum()``) of a tensor at least 4x the last-level cache, repeated
:data:`READS` times and measured once per process (:func:`read_roof`), so every notebook of a
session reads against one figure and prints its spread. :func:`classify` places a timed kernel by
its intensity against its dtype's measured ridge; :func:`reason` gives a reason for a speed ratio
only where the measured fractions support one.
"""

import functools
import statistics
from dataclasses import dataclass

import torch

from . import timing
from .device import last_level_cache_bytes

CALL_S = 0.004  # a roof's GEMM grows (n doubles from MIN_N) until one call takes this long
MIN_N = 512  # smaller GEMMs time the call's overhead (and, on a busy CPU, a stalled thread)
MAX_N_CPU = 2048
MAX_N_GPU = 16384  # an H100's bf16 GEMM needs n = 8192-16384 to fill CALL_S
FAR_BELOW = 0.5  # a kernel under this fraction of its roof "runs far below its roof"
CACHE_MULTIPLE = 4  # the streaming read holds at least this many last-level caches
CPU_STREAM_CAP = 512 << 20  # the most bytes the CPU's streaming read holds
GPU_STREAM_MIN = 1 << 30  # 4x MI300X's 256 MB Infinity Cache, which CUDA's L2 figure leaves out
READS = 25  # timed streaming reads: the best is the roof, the others its spread


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


def has_roof(dtype: torch.dtype, description: dict) -> bool:
    """float32, or a 16-bit dtype the described device computes natively (by its documented
    capabilities, never by a timing)."""
    from .precision import native_dtypes
    return dtype == torch.float32 or dtype in native_dtypes(description)


def max_n(device: str | torch.device) -> int:
    return MAX_N_CPU if torch.device(device).type == "cpu" else MAX_N_GPU


def random_square(n: int, dtype: torch.dtype, device: str | torch.device,
                  seed: int = 0) -> torch.Tensor:
    """n x n standard normal values (all-ones operands flatter a GPU's GEMM), seeded."""
    generator = torch.Generator(device).manual_seed(seed)
    return torch.randn(n, n, device=device, dtype=dtype, generator=generator)


def gemm_rate(dtype: torch.dtype, device: str | torch.device = "cpu") -> tuple[float, int]:
    """(FLOP/s, n) of the fastest n x n @ n x n GEMM in ``dtype``, n sized by :data:`CALL_S`."""
    sync = timing.synchronizer(device)
    n = MIN_N
    while True:
        a, b = random_square(n, dtype, device), random_square(n, dtype, device, seed=1)
        c = torch.empty(n, n, device=device, dtype=dtype)
        timing.seconds_per_call(lambda: torch.mm(a, b, out=c), 1, sync)  # warm-up
        one_call = min(timing.seconds_per_call(lambda: torch.mm(a, b, out=c), 1, sync)
                       for _ in range(3))  # the least disturbed of three calls
        if one_call >= CALL_S or n >= max_n(device):
            break
        n *= 2
    seconds = best_seconds(lambda: torch.mm(a, b, out=c), device, min_s=CALL_S)
    return 2 * n**3 / seconds, n


def stream_bytes(device: str | torch.device) -> int:
    """Bytes of the streaming read: at least :data:`CACHE_MULTIPLE` last-level caches."""
    device = torch.device(device)
    if device.type == "cpu":
        return min(CACHE_MULTIPLE * last_level_cache_bytes(), CPU_STREAM_CAP)
    l2 = 0
    if device.type == "cuda":
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
    return max(GPU_STREAM_MIN, CACHE_MULTIPLE * l2)


@dataclass(frozen=True)
class ReadRoof:
    """Bytes/s of each timed streaming read of ``nbytes`` at ``threads`` threads."""
    rates: tuple[float, ...]
    nbytes: int
    threads: int

    @property
    def best(self) -> float:
        return max(self.rates)

    def __str__(self) -> str:
        low, median = min(self.rates), statistics.median(self.rates)
        return (f"streaming read: {self.best / 1e9:.1f} GB/s, the best of {len(self.rates)} reads "
                f"of {self.nbytes >> 20} MiB ({self.threads} threads; median "
                f"{median / 1e9:.1f}, slowest {low / 1e9:.1f} GB/s)")


@functools.cache
def _read_roof(device: str, threads: int) -> ReadRoof:
    nbytes = stream_bytes(device)
    x = torch.randn(nbytes // 4, device=device, generator=torch.Generator(device).manual_seed(0))
    sync = timing.synchronizer(device)
    timing.seconds_per_call(x.sum, 1, sync)  # warm-up
    seconds = [timing.seconds_per_call(x.sum, 1, sync) for _ in range(READS)]
    return ReadRoof(tuple(sorted(nbytes / s for s in seconds)), nbytes, threads)


def read_roof(device: str | torch.device = "cpu", threads: int | None = None) -> ReadRoof:
    """The streaming-read roof at ``threads`` (default: as set), measured once per process and
    device: every later call, from any notebook cell or helper, returns the same figure."""
    threads = threads or torch.get_num_threads()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _read_roof(str(torch.device(device)), threads)
    finally:
        torch.set_num_threads(previous)


@dataclass(frozen=True)
class Roofs:
    """FLOP/s of a GEMM per dtype with a roof, bytes/s of a streaming read, at ``threads``
    threads; ``emulated``: the dtypes asked for that the machine emulates (no roof)."""
    compute: dict[str, float]
    gemm_n: dict[str, int]
    bandwidth: float
    threads: int
    emulated: tuple[str, ...] = ()
    read: ReadRoof | None = None

    def has_roof(self, dtype: str) -> bool:
        return dtype in self.compute

    def ridge(self, dtype: str) -> float:
        """FLOPs per byte where the two roofs meet."""
        return self.compute[dtype] / self.bandwidth

    def roof(self, dtype: str, intensity: float) -> float:
        """The most FLOP/s a kernel of ``intensity`` FLOPs per byte can reach in ``dtype``."""
        return min(self.compute[dtype], intensity * self.bandwidth)

    def __str__(self) -> str:
        read = str(self.read) if self.read else (f"streaming read: {self.bandwidth / 1e9:.1f} "
                                                f"GB/s ({self.threads} threads)")
        lines = [read]
        lines += [f"{d:>9} GEMM (n={self.gemm_n[d]}): {self.compute[d] / 1e9:7.1f} GFLOP/s, ridge "
                  f"at {self.ridge(d):6.2f} FLOP/byte" for d in self.compute]
        lines += [f"{d:>9}: emulated here (no native units): no roof here, the kernel decides"
                  for d in self.emulated]
        return "\n".join(lines)


@functools.cache
def _gemm(dtype: torch.dtype, device: str, threads: int) -> tuple[float, int]:
    from .device import strict_fp32
    with strict_fp32():
        return gemm_rate(dtype, device)


def measure(dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16),
            device: str | torch.device = "cpu", threads: int | None = None,
            description: dict | None = None) -> Roofs:
    """This machine's roofs at ``threads`` threads (default: as set), float32 kept strict; a
    GEMM only for the dtypes with a roof (``description``: the device's, or a made-up one)."""
    from .precision import describe_device
    description = description or describe_device(device)
    threads = threads or torch.get_num_threads()
    native = [d for d in dtypes if has_roof(d, description)]
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gemms = {name(d): _gemm(d, str(torch.device(device)), threads) for d in native}
    finally:
        torch.set_num_threads(previous)
    read = read_roof(device, threads)
    return Roofs({d: r for d, (r, _) in gemms.items()}, {d: n for d, (_, n) in gemms.items()},
                 read.best, threads, tuple(name(d) for d in dtypes if d not in native), read)


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
        rates = (f"{self.dtype} {self.seconds * 1e3:.2f} ms: {self.flops / self.seconds / 1e9:.1f} "
                 f"GFLOP/s, {self.nbytes / self.seconds / 1e9:.1f} GB/s")
        side = classify(self, roofs)
        if side == "no roof":
            return f"{rates}, {self.dtype} emulated: no roof here, the kernel decides"
        share = self.fraction(roofs)
        far = " (far below it)" if share < FAR_BELOW else ""
        return f"{rates}, {side}: {share:.0%} of its roof{far}"


def classify(kernel, roofs: Roofs) -> str:
    """"memory-bound" or "compute-bound": a timed kernel's ``intensity`` (FLOPs per byte) against
    the measured ridge of its ``dtype``; "no roof" for a dtype the machine emulates. The one
    classifier of notebooks 00, 01, 06, 08 and 09 (any object with ``dtype`` and ``intensity``)."""
    if not roofs.has_roof(kernel.dtype):
        return "no roof"
    return "memory-bound" if kernel.intensity < roofs.ridge(kernel.dtype) else "compute-bound"


def reason(result, baseline: Kernel, candidate: Kernel, roofs: Roofs) -> str:
    """Why ``result`` (a :class:`timing.Comparison`, baseline = float32) came out as it did, from
    each kernel's fraction of its roof; no reason where a dtype has no roof or the baseline runs
    far below its own; "unexplained here" where the fractions do not say."""
    if result.verdict not in ("faster", "slower"):
        return f"no reason given: {result.verdict}"
    no_roof = [k.dtype for k in (baseline, candidate) if not roofs.has_roof(k.dtype)]
    if no_roof:
        return f"no roof here for {no_roof[0]} (emulated): the kernel decides"
    base, cand = baseline.fraction(roofs), candidate.fraction(roofs)
    allowed = (roofs.roof(candidate.dtype, candidate.intensity)
               / roofs.roof(baseline.dtype, baseline.intensity))
    numbers = (f"the roofs allow {allowed:.2f}x; {baseline.dtype} at {base:.0%} of its roof, "
               f"{candidate.dtype} at {cand:.0%} of its")
    if max(base, cand) > 1.2:
        return f"unexplained here ({numbers}: a kernel above its measured roof)"
    if base < FAR_BELOW:
        return (f"the roofs do not explain this ratio: {baseline.dtype} runs below "
                f"{FAR_BELOW:.0%} of its own roof ({numbers})")
    if result.low <= allowed <= result.high:
        return f"as the roofs predict ({numbers})"
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
    """One kernel per line, "; "-joined: time, GFLOP/s, GB/s, its side, fraction of its roof."""
    return "; ".join(k.describe(roofs) for k in kernels)
