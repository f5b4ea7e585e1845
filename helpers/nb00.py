"""Notebook 00's scaffolding: the roofline (§2), tables, spacing plot (§3-4), 00.4's data."""

import collections
import math
from dataclasses import dataclass

import torch

from . import timing
from .device import last_level_cache_bytes
from .formats import ALL_FORMATS, bit_fields, format_facts, round_trip

COLOURS = {"float32": "tab:blue", "bfloat16": "tab:green", "float16": "tab:orange"}
SWEEP_FLOPS = 8e9  # the time budget: float32 FLOPs of the largest batch's call (past batch 32)
STREAM_CAP = 128 << 20  # the most bytes one 16-bit tensor of the sweep holds (memory and time)


def sweep_sizes(device: str | torch.device) -> tuple[int, tuple[int, ...], int, bool]:
    """(n x n weights, batches, add's elements, inside the cache?) for §2. CPU: each 16-bit
    tensor 2x the last-level cache where :data:`STREAM_CAP` allows, so the slope is memory's."""
    if torch.device(device).type in ("cuda", "mps"):
        return 8192, (1, 4, 16, 64, 256, 1024, 4096), 1 << 26, False
    llc = last_level_cache_bytes()
    stream = max(8 << 20, min(2 * llc, STREAM_CAP))  # bytes of one 16-bit tensor
    elements = stream // 2
    n = 256 * math.ceil(math.sqrt(elements) / 256)  # 16-bit weights: the add's vector
    batches = tuple(b for b in (2**k for k in range(10)) if b <= 32 or 2 * b * n * n <= SWEEP_FLOPS)
    return n, batches, elements, stream < 2 * llc


class Point(collections.namedtuple("Point", "dtype op size flops nbytes seconds")):
    """One timed op ("linear", "add"; ``size``: batch or elements): FLOPs, fewest bytes, seconds."""

    @property
    def intensity(self) -> float:  # FLOPs per byte moved: an upper bound (the fewest bytes)
        return self.flops / self.nbytes

    @property
    def rate(self) -> float:  # achieved FLOP/s
        return self.flops / self.seconds


@dataclass(frozen=True)
class Roofline:
    """Per dtype, the roofs one sweep measured (add's bytes/s, fastest linear's FLOP/s)."""
    points: list[Point]
    bandwidth: dict[str, float]
    compute: dict[str, float]

    @classmethod
    def from_points(cls, points: list[Point]) -> "Roofline":
        largest = max(p.size for p in points if p.op == "add")
        return cls(points, {p.dtype: p.nbytes / p.seconds for p in points
                            if (p.op, p.size) == ("add", largest)},
                   {d: max(p.rate for p in points if (p.dtype, p.op) == (d, "linear"))
                    for d in COLOURS})

    def ridge(self, dtype: str) -> float:
        return self.compute[dtype] / self.bandwidth[dtype]

    def ratios(self, dtype: str) -> dict[int, float]:
        """float32's time / ``dtype``'s per batch both ran (above 1: ``dtype`` is faster)."""
        time = {(p.dtype, p.size): p.seconds for p in self.points if p.op == "linear"}
        return {b: time["float32", b] / t for (d, b), t in time.items() if d == dtype}

    def ties_up_to(self, dtype: str) -> int | None:
        """The largest batch up to which ``dtype`` ran at least 0.9x float32's speed throughout."""
        ratios = sorted(self.ratios(dtype).items())
        lost = [b for b, r in ratios if r < 0.9]
        return max((b for b, _ in ratios if not lost or b < lost[0]), default=None)

    def _words(self, d: str) -> str:
        """Where ``d``'s weights keep up with float32 (fastest of a few calls each: a reading of
        the sweep, not a verdict; the batch-1 comparison below gives one)."""
        ratios, tied = self.ratios(d), self.ties_up_to(d)
        if tied == max(ratios):
            return f"keeps up with float32 (0.9x or better) at every batch measured, 1 to {tied}"
        lost = min(b for b, r in ratios.items() if r < 0.9 and b > (tied or 0))
        point = next(p for p in self.points if (p.dtype, p.op, p.size) == (d, "linear", lost))
        bound = (f"intensity {point.intensity:.1f} > its ridge: compute-bound, only 16-bit units "
                 "help" if point.intensity > self.ridge(d)
                 else "below its ridge: this kernel moves its bytes slower than float32's")
        start = f"keeps up to batch {tied}" if tied else "slower than float32 from batch 1"
        return f"{start}; from batch {lost} under 0.9x float32 ({bound})"

    def __str__(self) -> str:
        lines = [f"{d:>9}: bandwidth roof {self.bandwidth[d] / 1e9:6.1f} GB/s, compute roof "
                 f"{self.compute[d] / 1e9:6.1f} GFLOP/s, ridge at {self.ridge(d):5.2f} FLOP/byte"
                 for d in COLOURS]
        lines += [f"{d} weights: {self._words(d)}" for d in ("bfloat16", "float16")]
        tiny = min((p for p in self.points if (p.dtype, p.op) == ("float32", "add")),
                   key=lambda p: p.size)
        speed = tiny.nbytes / tiny.seconds
        lines.append(f"overhead-bound: a float32 add of {tiny.size:,} elements takes "
                     f"{tiny.seconds * 1e6:.1f} us, {speed / 1e9:.1f} GB/s: "
                     f"{speed / self.bandwidth['float32']:.0%} of the bandwidth roof")
        return "\n".join(lines)


def fastest_seconds(fn, device: str | torch.device = "cpu", calls: int = 3,
                    min_s: float = 0.005) -> float:
    """The fastest of ``calls`` timed runs after a warm-up, each run repeating ``fn`` for at least
    ``min_s`` (a roof is the best a kernel does; ratios use :func:`helpers.timing.compare`)."""
    sync = timing.synchronizer(device)
    once = timing.seconds_per_call(fn, 1, sync)  # the warm-up, and how long one call takes
    repeat = max(1, int(min_s / once))
    return min(timing.seconds_per_call(fn, repeat, sync) for _ in range(calls))


def agreement(rule, dtype: torch.dtype, comparison) -> str:
    """A batch-1 comparison (:class:`helpers.timing.Comparison`) against the rule's advice for
    chat decoding (:class:`helpers.precision.Advice`), in words: agreement, or a finding and why."""
    name = str(dtype).removeprefix("torch.")
    if rule.how == "measure":
        return ("the rule leaves batch-1 work to measurement here: this is one (08 §5 times a real "
                "decoder)")
    if rule.dtype != dtype:
        return f"the rule advises {rule.how} {str(rule.dtype)[6:]} for decoding here, not {name}"
    if comparison.verdict == "faster":
        return f"agrees with the rule ({name} weights for decoding)"
    if comparison.verdict == "slower":
        return (f"disagrees with the rule ({name} weights for decoding): a finding; likely reason: "
                "this 16-bit kernel streams its bytes slower than float32's")
    return f"no clear difference: neither confirms nor contradicts the rule ({name} weights)"


def plot_roofline(roofline: Roofline, ax=None):
    """Achieved GFLOP/s against FLOPs per byte, log-log: the measured roofs, and a marker per op."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(7.5, 4.2), dpi=80)[1]
    intensities = [p.intensity for p in roofline.points]
    grid = torch.logspace(math.log10(min(intensities) / 2), math.log10(max(intensities) * 2), 200)
    for d, colour in COLOURS.items():
        roof = torch.minimum(grid * roofline.bandwidth[d], torch.tensor(roofline.compute[d]))
        ax.loglog(grid, roof / 1e9, color=colour, linewidth=1, alpha=0.6)
        for op, marker in (("linear", "o"), ("add", "s")):
            mine = sorted((p for p in roofline.points if (p.dtype, p.op) == (d, op)),
                          key=lambda p: p.size)
            ax.loglog([p.intensity for p in mine], [p.rate / 1e9 for p in mine], marker,
                      color=colour, label=f"{d} {op}")
    ax.set(xlabel="arithmetic intensity (FLOPs per byte moved)", ylabel="achieved GFLOP/s")
    ax.set_title("Roofline measured here: lines = roofs, circles = F.linear by batch", fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    return ax


def format_table(dtypes: tuple[torch.dtype, ...] = ALL_FORMATS) -> str:
    """A text table of the :class:`helpers.formats.FormatFacts` of ``dtypes``, one column each."""
    facts = [format_facts(dtype) for dtype in dtypes]
    rows = [("total bits", "bits", "{}"), ("exponent bits", "exponent_bits", "{}"),
            ("mantissa bits", "mantissa_bits", "{}"), ("largest finite", "max", "{:.4g}"),
            ("smallest normal", "smallest_normal", "{:.3g}"),
            ("smallest subnormal", "smallest_subnormal", "{:.3g}"),
            ("eps (gap after 1.0)", "eps", "{:.3g}"),
            ("exact integers up to", "max_exact_integer", "{}")]
    lines = [f"{'':>21}" + "".join(f"{f.name.removeprefix('float8_'):>14}" for f in facts)]
    lines += [f"{label:>21}" + "".join(f"{fmt.format(getattr(f, name)):>14}" for f in facts)
              for label, name, fmt in rows]
    return "\n".join(lines)


def bit_table(values: tuple[float, ...], dtypes: tuple[torch.dtype, ...] = ALL_FORMATS) -> str:
    """Lines ``value  dtype: sign | exponent | mantissa  stores ...`` per value and dtype."""
    lines = []
    for value in values:
        for dtype in dtypes:
            sign, exponent, mantissa = bit_fields(value, dtype)
            lines.append(f"{value:>8} {format_facts(dtype).name:>13}: {sign} | {exponent:<8} | "
                         f"{mantissa:<23}  stores {round_trip(value, dtype).item()!r}")
        lines.append("")
    return "\n".join(lines)


def plot_spacing(magnitudes: torch.Tensor, gaps: dict[torch.dtype, torch.Tensor], ax=None):
    """Log-log gap vs magnitude per dtype in its range (lines: largest finite, smallest normal)."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(7.5, 4), dpi=80)[1]
    colours = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")
    for (dtype, gap), colour in zip(gaps.items(), colours):
        f = format_facts(dtype)
        inside = (magnitudes >= f.smallest_subnormal) & (magnitudes <= f.max)
        ax.loglog(magnitudes[inside], gap[inside], label=f.name, color=colour)
        ax.axvline(f.max, color=colour, linestyle="--", linewidth=1)
        ax.axvline(f.smallest_normal, color=colour, linestyle=":", linewidth=1)
    ax.set(xlabel="magnitude |x|", ylabel="gap to the next representable number")
    ax.set_title("Spacing vs magnitude (dashed: largest finite, dotted: smallest normal)", size=9)
    ax.legend(fontsize=8)
    return ax


def logged_losses(n: int = 10_000, seed: int = 0) -> torch.Tensor:
    """``n`` per-batch losses around 2.3, stored in float16 as a training log might (00.4)."""
    generator = torch.Generator().manual_seed(seed)
    return (2.3 + 0.2 * torch.randn(n, generator=generator)).to(torch.float16)
