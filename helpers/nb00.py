"""Notebook 00's scaffolding: the roofline's sizes, points, reading and plot (§2), the verdict table
(§1), the format tables and spacing plot (§3-4), and exercise 00.4's logged losses."""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from .formats import ALL_FORMATS, bit_fields, format_facts, round_trip
from .speed import DtypeSpeed, default_sizes

COLOURS = {"float32": "tab:blue", "bfloat16": "tab:green", "float16": "tab:orange"}


def sweep_sizes(device: str | torch.device) -> tuple[int, tuple[int, ...], int]:
    """(n of the n x n weights, batch sizes, elements of the streamed add): weights and add past the
    last-level cache (a GPU's L2 too), batches from 1 to well past the ridge point."""
    if torch.device(device).type == "cuda":
        return 8192, (1, 4, 16, 64, 256, 1024, 4096), 1 << 26
    return 4096, (1, 2, 4, 8, 16, 32, 64, 128), default_sizes(device)[1]


@contextlib.contextmanager
def cpu_threads(threads: int):
    """Run the block on ``threads`` CPU threads (steadier timings on a busy machine), then restore.
    """
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


@dataclass(frozen=True)
class Point:
    """One timed op: its floating-point operations, the bytes it must move, and its time."""

    dtype: str
    op: str  # "linear" or "add"
    size: int  # batch for linear, elements for add
    flops: int
    nbytes: int
    seconds: float

    @property
    def intensity(self) -> float:
        """Arithmetic intensity: FLOPs per byte moved."""
        return self.flops / self.nbytes

    @property
    def rate(self) -> float:
        """Achieved FLOP/s."""
        return self.flops / self.seconds


def _ratio(points: list[Point], dtype: str) -> dict[int, float]:
    """float32's time / ``dtype``'s for each batch both ran (above 1: ``dtype`` faster)."""
    time = {(p.dtype, p.size): p.seconds for p in points if p.op == "linear"}
    return {b: time["float32", b] / t for (d, b), t in time.items() if d == dtype and ("float32", b) in time}


@dataclass(frozen=True)
class Roofline:
    """The roofs measured from one sweep, and the finding they give."""

    points: list[Point]
    bandwidth: dict[str, float]  # bytes/s of the add past the cache, per dtype
    compute: dict[str, float]  # the fastest linear's FLOP/s, per dtype

    @classmethod
    def from_points(cls, points: list[Point]) -> "Roofline":
        largest = max(p.size for p in points if p.op == "add")
        return cls(points, {p.dtype: p.nbytes / p.seconds for p in points if p.size == largest},
                   {d: max(p.rate for p in points if p.dtype == d and p.op == "linear") for d in COLOURS})

    def ties_up_to(self, dtype: str) -> int | None:
        """The largest batch up to which ``dtype`` ran at least 0.9x float32's speed at every batch.
        """
        tied = None
        for batch, ratio in sorted(_ratio(self.points, dtype).items()):
            if ratio < 0.9:
                break
            tied = batch
        return tied

    def __str__(self) -> str:
        lines = [f"{d:>9}: bandwidth roof {self.bandwidth[d] / 1e9:6.1f} GB/s, compute roof "
                 f"{self.compute[d] / 1e9:6.1f} GFLOP/s, ridge at {self.compute[d] / self.bandwidth[d]:5.2f}"
                 " FLOP/byte" for d in COLOURS]
        for d in ("bfloat16", "float16"):
            ratios, tied = _ratio(self.points, d), self.ties_up_to(d)
            ran = max(ratios)
            words = (f"ties or wins (>= 0.9x float32) at every batch measured, 1 to {ran}" if tied == ran
                     else f"ties or wins up to batch {tied}" if tied else "slower than float32 from batch 1")
            if tied != ran:
                lost = min(b for b, r in ratios.items() if r < 0.9 and b > (tied or 0))
                point = next(p for p in self.points if (p.dtype, p.op, p.size) == (d, "linear", lost))
                bound = (f"compute-bound (intensity {point.intensity:.1f} > ridge): only 16-bit units help"
                         if point.intensity > self.compute[d] / self.bandwidth[d] else
                         "below the ridge: this kernel moves its bytes slower than float32's")
                words += f"; batch {lost}: {ratios[lost]:.2f}x, {bound}"
            lines.append(f"{d} weights: {words} (batch 1: {ratios[1]:.2f}x)")
        tiny = min((p for p in self.points if p.dtype == "float32" and p.op == "add"), key=lambda p: p.size)
        speed = tiny.nbytes / tiny.seconds
        lines.append(f"overhead-bound: a float32 add of {tiny.size:,} elements takes {tiny.seconds * 1e6:.1f} us,"
                     f" {speed / 1e9:.1f} GB/s: {speed / self.bandwidth['float32']:.0%} of the bandwidth roof")
        return "\n".join(lines)


def plot_roofline(roofline: Roofline, ax=None):
    """Achieved GFLOP/s against FLOPs per byte, log-log: lines for the roofs, markers for the ops.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 4.2), dpi=80)
    intensities = [p.intensity for p in roofline.points]
    grid = torch.logspace(math.log10(min(intensities) / 2), math.log10(max(intensities) * 2), 200)
    for d, colour in COLOURS.items():
        roof = torch.minimum(grid * roofline.bandwidth[d], torch.tensor(roofline.compute[d]))
        ax.loglog(grid, roof / 1e9, color=colour, linewidth=1, alpha=0.6)
        for op, marker in (("linear", "o"), ("add", "s")):
            mine = sorted((p for p in roofline.points if p.dtype == d and p.op == op), key=lambda p: p.size)
            ax.loglog([p.intensity for p in mine], [p.rate / 1e9 for p in mine], marker, color=colour,
                      label=f"{d} {op}")
    ax.set_xlabel("arithmetic intensity (FLOPs per byte moved)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title("Roofline measured here: lines = measured roofs, circles = F.linear by batch", fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    return ax


def verdict_table(profile: dict[str, DtypeSpeed], explanation: dict[str, str]) -> str:
    """One line per dtype: the measured verdict, then what the hardware reports (which only explains
    it)."""
    return "\n".join(f"{name:>9}: measured: {speed.verdict}\n{'':>9}  reported: {explanation.get(name, '-')}"
                     for name, speed in profile.items())


def format_table(dtypes: tuple[torch.dtype, ...] = ALL_FORMATS) -> str:
    """A text table of the :class:`helpers.formats.FormatFacts` of ``dtypes``, one column per dtype.
    """
    facts = [format_facts(dtype) for dtype in dtypes]
    rows = [("total bits", "bits", "{}"), ("exponent bits", "exponent_bits", "{}"),
            ("mantissa bits", "mantissa_bits", "{}"), ("largest finite", "max", "{:.4g}"),
            ("smallest normal", "smallest_normal", "{:.3g}"),
            ("smallest subnormal", "smallest_subnormal", "{:.3g}"), ("eps (gap after 1.0)", "eps", "{:.3g}"),
            ("exact integers up to", "max_exact_integer", "{}")]
    lines = [f"{'':>21}" + "".join(f"{f.name.removeprefix('float8_'):>14}" for f in facts)]
    for label, attribute, fmt in rows:
        lines.append(f"{label:>21}" + "".join(f"{fmt.format(getattr(f, attribute)):>14}" for f in facts))
    return "\n".join(lines)


def bit_table(values: tuple[float, ...], dtypes: tuple[torch.dtype, ...] = ALL_FORMATS) -> str:
    """Lines ``value  dtype: sign | exponent | mantissa  stores ...`` for each value and dtype."""
    lines = []
    for value in values:
        for dtype in dtypes:
            sign, exponent, mantissa = bit_fields(value, dtype)
            lines.append(f"{value:>8} {format_facts(dtype).name:>13}: {sign} | {exponent:<8} | "
                         f"{mantissa:<23}  stores {round_trip(value, dtype).item()!r}")
        lines.append("")
    return "\n".join(lines)


def plot_spacing(magnitudes: torch.Tensor, gaps: dict[torch.dtype, torch.Tensor], ax=None):
    """Log-log gap vs magnitude per dtype, within its range; dashed: largest finite, dotted:
    smallest normal (left of it: subnormals, then underflow to zero)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 4), dpi=80)
    for (dtype, gap), colour in zip(gaps.items(), ("tab:blue", "tab:orange", "tab:green", "tab:red",
                                                   "tab:purple")):
        f = format_facts(dtype)
        inside = (magnitudes >= f.smallest_subnormal) & (magnitudes <= f.max)
        ax.loglog(magnitudes[inside], gap[inside], label=f.name, color=colour)
        ax.axvline(f.max, color=colour, linestyle="--", linewidth=1)
        ax.axvline(f.smallest_normal, color=colour, linestyle=":", linewidth=1)
    ax.set_xlabel("magnitude |x|")
    ax.set_ylabel("gap to the next representable number")
    ax.set_title("Spacing vs magnitude (dashed: largest finite; dotted: smallest normal)", fontsize=10)
    ax.legend(fontsize=8)
    return ax


def logged_losses(n: int = 10_000, seed: int = 0) -> torch.Tensor:
    """``n`` per-batch loss values around 2.3, stored in float16 as a training log might keep them
    (00.4)."""
    generator = torch.Generator().manual_seed(seed)
    return (2.3 + 0.2 * torch.randn(n, generator=generator)).to(torch.float16)
