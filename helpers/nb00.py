"""Two kinds of speed, measured: a memory-bound op (add) and a compute-bound one (matmul), per dtype and size.

Also the setup check's reading of :func:`helpers.speed.speed_profile`: a verdict per dtype and what to use on
this machine for inference and for training (:func:`recommendation`), derived from the measured ratios only.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .device import strict_fp32
from .speed import DtypeSpeed, workload
from .measure import fastest_time

SPEED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class SpeedPoint:
    """One timing: ``op`` ("add" or "matmul") in ``dtype`` at ``size`` (elements for add, n for an n x n matmul)."""

    op: str
    dtype: str
    size: int
    seconds: float

    @property
    def rate(self) -> float:
        """Work per second: elements per second for add, floating-point operations per second for matmul."""
        work = self.size if self.op == "add" else 2 * self.size**3
        return work / self.seconds


def default_sizes(device: str | torch.device) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(add sizes in elements, matmul sizes n): from cache-sized to memory- or compute-bound, per device type."""
    if torch.device(device).type == "cuda":
        return (1 << 14, 1 << 18, 1 << 22, 1 << 26), (256, 1024, 2048, 4096)
    return (1 << 12, 1 << 16, 1 << 20, 1 << 24), (64, 128, 256, 512)


def measure_two_kinds(device: str | torch.device = "cpu", add_sizes: tuple[int, ...] | None = None,
                      matmul_sizes: tuple[int, ...] | None = None,
                      min_run_time: float = 0.01, cpu_threads: int | None = 1) -> list[SpeedPoint]:
    """Time ``x + x`` and ``a @ a`` in float32, bfloat16 and float16 over a few sizes on ``device``.

    A dtype whose matmuls this machine emulates (see :func:`helpers.speed.workload`) skips the largest matmul
    size, so that the whole measurement stays well under 3 s even on a laptop CPU without 16-bit units. float32
    matmuls run strict (no TF32) on a GPU. Each point is the fastest block of repeated calls, so that a busy
    machine disturbs the picture less than a median would. On a CPU it runs on ``cpu_threads`` threads (default
    one: a second thread that must be woken for every call makes small timings erratic on a busy machine, and
    one core shows the same contrast between the two kinds); ``None`` keeps PyTorch's setting.
    """
    device = torch.device(device)
    default_add, default_mm = default_sizes(device)
    add_sizes, matmul_sizes = add_sizes or default_add, matmul_sizes or default_mm
    # decided before changing the thread count: speed_profile is measured (and cached) with the usual threads
    largest = {dtype: workload(dtype, matmul_sizes[-1], matmul_sizes[-2], device) for dtype in SPEED_DTYPES}
    saved_threads = torch.get_num_threads()
    if device.type == "cpu" and cpu_threads is not None:
        torch.set_num_threads(cpu_threads)
    try:
        return _measure(device, add_sizes, matmul_sizes, largest, min_run_time)
    finally:
        torch.set_num_threads(saved_threads)


def _measure(device: torch.device, add_sizes: tuple[int, ...], matmul_sizes: tuple[int, ...],
             largest: dict[torch.dtype, int], min_run_time: float) -> list[SpeedPoint]:
    generator = torch.Generator(device).manual_seed(0)
    points = []
    for dtype in SPEED_DTYPES:
        name = str(dtype).removeprefix("torch.")
        for n in add_sizes:
            x = torch.ones(n, device=device, dtype=dtype)  # the values do not matter to an add's speed
            points.append(SpeedPoint("add", name, n, fastest_time(lambda: x + x, min_run_time=min_run_time)))
        for n in (n for n in matmul_sizes if n <= largest[dtype]):
            a = torch.randn(n, n, device=device, generator=generator).to(dtype)
            with strict_fp32():
                seconds = fastest_time(lambda: a @ a, min_run_time=min_run_time)
            points.append(SpeedPoint("matmul", name, n, seconds))
    return points


def speedups(points: list[SpeedPoint], op: str) -> tuple[int, dict[str, float]]:
    """At the largest size that every dtype ran for ``op``: that size and each dtype's speed / float32's."""
    sizes = {p.dtype: {q.size for q in points if q.op == op and q.dtype == p.dtype} for p in points}
    size = max(set.intersection(*sizes.values()))
    rate = {p.dtype: p.rate for p in points if p.op == op and p.size == size}
    return size, {dtype: rate[dtype] / rate["float32"] for dtype in rate}


def _ratio_words(ratio: float) -> str:
    return f"{ratio:.1f}x faster than" if ratio >= 1.1 else (
        f"{1 / ratio:.0f}x slower than" if ratio < 0.33 else f"{ratio:.2f}x the speed of")


def two_kinds_finding(points: list[SpeedPoint]) -> str:
    """The finding of the two-kinds-of-speed experiment, in words, from the measured points only."""
    add_size, add = speedups(points, "add")
    mm_size, mm = speedups(points, "matmul")
    lines = [f"Memory-bound (add, {add_size:,} elements): "
             + "; ".join(f"{d} {_ratio_words(r)} float32" for d, r in add.items() if d != "float32")]
    lines.append(f"Compute-bound (matmul {mm_size}x{mm_size}): "
                 + "; ".join(f"{d} {_ratio_words(r)} float32" for d, r in mm.items() if d != "float32"))
    fewer_bytes = [d for d, r in add.items() if d != "float32" and r >= 1.1]
    fast_math = [d for d, r in mm.items() if d != "float32" and r >= 1.1]
    lines.append(f"Half the bytes sped up the memory-bound op in: {', '.join(fewer_bytes) or 'none, this run'}. "
                 f"Faster math (16-bit units) here for: {', '.join(fast_math) or 'none'}.")
    return "\n".join(lines)


def plot_two_kinds(points: list[SpeedPoint], ax=None):
    """Two panels: elements per second of add vs size, and GFLOP/s of matmul vs n, one line per dtype."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(1, 2, figsize=(9, 3.4), dpi=80)
    colours = {"float32": "tab:blue", "bfloat16": "tab:green", "float16": "tab:orange"}
    for panel, op, scale, ylabel in ((ax[0], "add", 1e9, "G elements / s (x + x)"),
                                     (ax[1], "matmul", 1e9, "GFLOP/s (a @ a)")):
        for dtype, colour in colours.items():
            mine = sorted((p for p in points if p.op == op and p.dtype == dtype), key=lambda p: p.size)
            panel.plot([p.size for p in mine], [p.rate / scale for p in mine], "o-", color=colour, label=dtype)
        panel.set_xscale("log", base=2)
        panel.set_yscale("log")
        panel.set_ylabel(ylabel)
        panel.legend(fontsize=8)
    ax[0].set_xlabel("elements")
    ax[0].set_title("memory-bound: bytes per element count", fontsize=10)
    ax[1].set_xlabel("n (n x n matrices)")
    ax[1].set_title("compute-bound: arithmetic units count", fontsize=10)
    plt.tight_layout()
    return ax


def verdict_table(profile: dict[str, DtypeSpeed], explanation: dict[str, str]) -> str:
    """One line per dtype: the measured verdict, then what the hardware reports (which only explains it)."""
    lines = []
    for name, speed in profile.items():
        lines.append(f"{name:>9}: measured: {speed.verdict}")
        lines.append(f"{'':>9}  reported: {explanation.get(name, '-')}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Recommendation:
    """What to use on one device, derived from a measured speed profile."""

    inference: str
    training: str
    reason: str

    def __str__(self) -> str:
        return (f"Use here -> inference: {self.inference}\n"
                f"            training:  {self.training}\n"
                f"            because:   {self.reason}")


def recommendation(profile: dict[str, DtypeSpeed], device: str | torch.device) -> Recommendation:
    """What to use for inference and for training on ``device``, from the measured ``profile`` only.

    bfloat16 autocast where bf16 matmuls are at least float32's speed (no ``GradScaler`` needed: fp32's range);
    else float16 autocast with a ``GradScaler`` where fp16 matmuls are; else float32 (16-bit formats then only
    save memory and speed up memory-bound ops).
    """
    device_type = torch.device(device).type
    bf16, fp16 = profile["bfloat16"], profile["float16"]
    if bf16.compute_is_fast:
        return Recommendation(
            f"torch.amp.autocast({device_type!r}, dtype=torch.bfloat16)",
            f"the same autocast with float32 weights, no GradScaler (bf16 has float32's range)",
            f"bfloat16 matmuls measured {bf16.matmul_speedup:.1f}x float32")
    if fp16.compute_is_fast:
        return Recommendation(
            f"torch.amp.autocast({device_type!r}, dtype=torch.float16)",
            f"the same autocast with float32 weights and torch.amp.GradScaler({device_type!r})",
            f"float16 matmuls measured {fp16.matmul_speedup:.1f}x float32, bfloat16 "
            f"{bf16.matmul_speedup:.2f}x")
    return Recommendation(
        "float32 (store weights in 16 bits only to save memory)",
        "float32",
        f"16-bit matmuls measured {bf16.matmul_speedup:.2f}x (bf16) and {fp16.matmul_speedup:.2f}x (fp16) "
        "float32: no fast 16-bit arithmetic here")
