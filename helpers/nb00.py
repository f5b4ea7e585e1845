"""Notebook 00's scaffolding: the roofline (§2), tables, spacing plot (§3-4), 00.4's data."""

import collections
import math
from dataclasses import dataclass

import torch

from .device import last_level_cache_bytes
from .formats import ALL_FORMATS, bit_fields, format_facts, round_trip
from .roofs import FAR_BELOW, Roofs, classify

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
    """The sweep's points under the roofs measured on their own (:func:`helpers.roofs.measure`)."""
    points: list[Point]
    roofs: Roofs

    def fraction(self, point: Point) -> float | None:
        """The point's FLOP/s over the roof at its intensity, in its dtype (None: no roof)."""
        if not self.roofs.has_roof(point.dtype):
            return None
        return point.rate / self.roofs.roof(point.dtype, point.intensity)

    def ratios(self, dtype: str) -> dict[int, float]:
        """float32's time / ``dtype``'s per batch both ran (above 1: ``dtype`` is faster)."""
        time = {(p.dtype, p.size): p.seconds for p in self.points if p.op == "linear"}
        return {b: time["float32", b] / t for (d, b), t in time.items() if d == dtype}

    def ties_up_to(self, dtype: str) -> int | None:
        """The largest batch up to which ``dtype`` ran at least 0.9x float32's speed throughout."""
        ratios = sorted(self.ratios(dtype).items())
        lost = [b for b, r in ratios if r < 0.9]
        return max((b for b, _ in ratios if not lost or b < lost[0]), default=None)

    def linear(self, dtype: str, batch: int) -> Point | None:
        matching = (p for p in self.points if (p.dtype, p.op, p.size) == (dtype, "linear", batch))
        return next(matching, None)

    def _why(self, d: str, batch: int) -> str:
        """Why ``d`` falls behind float32 at ``batch``, from both points' fractions of their roofs."""
        mine, theirs = self.linear(d, batch), self.linear("float32", batch)
        side = classify(mine, self.roofs)
        if side == "no roof":
            return f"no roof here for {d} (emulated): the kernel decides"
        ridge, share = self.roofs.ridge(d), self.fraction(mine)
        numbers = f"{d} at {share:.0%} of its roof, float32 at {self.fraction(theirs):.0%}"
        side = side.removesuffix("-bound")
        if share > 1.2:
            return f"unexplained here: {numbers}, above the roof its square GEMM measured"
        if share < FAR_BELOW:
            return f"this {d} kernel runs far below its {side} roof: {numbers}"
        if side == "compute":
            return (f"intensity {mine.intensity:.1f} is past {d}'s GEMM ridge ({ridge:.2f}): its "
                    f"compute roof limits it; {numbers}")
        return f"unexplained here: {numbers}"

    def _words(self, d: str) -> str:
        """Where ``d``'s weights keep up with float32 (fastest of a few calls each: a reading of
        the sweep, not a verdict; the batch-1 comparison below gives one)."""
        ratios, tied = self.ratios(d), self.ties_up_to(d)
        if tied == max(ratios):
            return f"keeps up with float32 (0.9x or better) at every batch measured, 1 to {tied}"
        lost = min(b for b, r in ratios.items() if r < 0.9 and b > (tied or 0))
        start = f"keeps up to batch {tied}" if tied else "slower than float32 from batch 1"
        return f"{start}; from batch {lost} under 0.9x float32 ({self._why(d, lost)})"

    def _share(self, point: Point) -> str:
        share = self.fraction(point)
        return "no roof" if share is None else f"{share:5.0%}"

    def table(self) -> str:
        """Each F.linear point's GFLOP/s and fraction of the roof at its intensity, by batch."""
        batches = sorted({p.size for p in self.points if p.op == "linear"})
        lines = ["batch" + "".join(f"{d:>22}" for d in COLOURS)]
        for b in batches:
            cells = [self.linear(d, b) for d in COLOURS]
            texts = [f"{p.rate / 1e9:6.1f} GFLOP/s {self._share(p)}" if p else "-"
                     for p in cells]
            lines.append(f"{b:>5}" + "".join(f"{t:>22}" for t in texts))
        return "\n".join(lines)

    def __str__(self) -> str:
        lines = [str(self.roofs), "F.linear by batch: achieved GFLOP/s, fraction of its roof",
                 self.table()]
        lines += [f"{d} weights: {self._words(d)}" for d in ("bfloat16", "float16")]
        tiny = min((p for p in self.points if (p.dtype, p.op) == ("float32", "add")),
                   key=lambda p: p.size)
        speed = tiny.nbytes / tiny.seconds
        lines.append(f"overhead-bound: a float32 add of {tiny.size:,} elements takes "
                     f"{tiny.seconds * 1e6:.1f} us, {speed / 1e9:.1f} GB/s: "
                     f"{speed / self.roofs.bandwidth:.0%} of the streaming read")
        return "\n".join(lines)


def plot_roofline(roofline: Roofline, ax=None):
    """Achieved GFLOP/s against FLOPs per byte, log-log: the measured roofs, and a marker per op."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(7.5, 4.2), dpi=80)[1]
    intensities = [p.intensity for p in roofline.points]
    grid = torch.logspace(math.log10(min(intensities) / 2), math.log10(max(intensities) * 2), 200)
    for d, colour in COLOURS.items():
        if roofline.roofs.has_roof(d):  # an emulated dtype has points, no roof
            compute = torch.tensor(roofline.roofs.compute[d])
            roof = torch.minimum(grid * roofline.roofs.bandwidth, compute)
            ax.loglog(grid, roof / 1e9, color=colour, linewidth=1, alpha=0.6)
        for op, marker in (("linear", "o"), ("add", "s")):
            mine = sorted((p for p in roofline.points if (p.dtype, p.op) == (d, op)),
                          key=lambda p: p.size)
            ax.loglog([p.intensity for p in mine], [p.rate / 1e9 for p in mine], marker,
                      color=colour, label=f"{d} {op}")
    ax.set(xlabel="arithmetic intensity (FLOPs per byte moved)", ylabel="achieved GFLOP/s")
    ax.set_title("Roofs measured here (streaming read, GEMM per native dtype); circles: F.linear",
                 fontsize=9)
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
