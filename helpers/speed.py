"""How fast each 16-bit dtype is here (:func:`speed_profile`), work sized to it (:func:`workload`),
what to use per workload shape (:func:`recommendation`). Taught in notebook 00 §1-2."""
from __future__ import annotations

import functools
import json
import math
import os
import platform
from statistics import median_high as _median
from dataclasses import dataclass
from pathlib import Path

import torch

from .device import autocast_dtype, cpu_flags, strict_fp32, supported_autocast_dtypes

CACHE_VERSION = 2  # v2: nothing allocated while timed; the memory-bound add past the cache
SPEED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FAST_RATIO = 0.9  # within ~10 % of float32 or better: "fast" (timing noise on a busy laptop)
EMULATED_RATIO = 0.33  # 3x slower than float32 or worse: no 16-bit units for this dtype here
MAX_MEMORY_RATIO = 3.0  # half the bytes: about 2x (2.4x seen on one core); beyond 3x is noise


@dataclass(frozen=True)
class DtypeSpeed:
    """One dtype's measured speed relative to float32 on one device (above 1: faster)."""

    dtype: str
    matmul_speedup: float  # compute-bound: float32 time / this dtype's time, n x n matmul
    elementwise_speedup: float  # memory-bound: the same for adding two long vectors (NaN: noise)
    verdict: str  # the plain-words reading of the two ratios

    @property
    def compute_is_fast(self) -> bool:  # compute-bound matmuls about as fast as float32's or faster
        return self.matmul_speedup >= FAST_RATIO

    @property
    def emulated(self) -> bool:  # compute-bound matmuls 3x slower than float32's or worse
        return self.matmul_speedup < EMULATED_RATIO


def speed_verdict(matmul_speedup: float, elementwise_speedup: float, matmul_n: int = 256) -> str:
    """Words for a dtype's two measured ratios to float32 (see :class:`DtypeSpeed`)."""
    mm = f"{matmul_n}x{matmul_n} matmul (compute-bound)"
    if matmul_speedup >= 1.2:
        compute = f"native 16-bit math: {mm} {matmul_speedup:.1f}x faster than float32"
    elif matmul_speedup >= FAST_RATIO:
        compute = f"{mm} about as fast as float32 ({matmul_speedup:.2f}x)"
    elif matmul_speedup >= EMULATED_RATIO:
        compute = f"{mm} {1 / matmul_speedup:.1f}x slower than float32"
    else:
        compute = f"emulated: {mm} {1 / matmul_speedup:.0f}x slower than float32"
    if math.isnan(elementwise_speedup):
        return f"{compute}; memory-bound ops: timings disagreed (noise), measure again"
    if elementwise_speedup >= 1.1:
        return f"{compute}; memory-bound ops {elementwise_speedup:.1f}x faster (half the bytes)"
    return f"{compute}; memory-bound ops {elementwise_speedup:.2f}x float32"


def last_level_cache_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache"),
                           default: int = 32 << 20) -> int:
    """The largest CPU cache, from Linux's sysfs; ``default`` (32 MiB) where it cannot be read."""
    sizes = []
    for path in root.glob("index*/size"):
        text = path.read_text().strip().upper()
        sizes.append(int(text.rstrip("KM")) << {"K": 10, "M": 20}.get(text[-1:], 0))
    return max(sizes, default=default)


def default_sizes(device: str | torch.device) -> tuple[int, int]:
    """(n x n matmul, add's elements): on a CPU the add streams past the last-level cache."""
    if torch.device(device).type == "cuda":
        return 4096, 1 << 26
    return 256, max(1 << 22, last_level_cache_bytes())


def timed_ops(dtype: torch.dtype, device: torch.device, matmul_n: int, elementwise_n: int):
    """The two calls the profile times, into outputs allocated here (``out=``): no allocator."""
    generator = torch.Generator(device).manual_seed(0)
    a = torch.randn(matmul_n, matmul_n, device=device, generator=generator).to(dtype)
    x, y = torch.ones(2, elementwise_n, device=device, dtype=dtype)  # values: no matter to an add
    c, z = torch.empty_like(a), torch.empty_like(x)
    return (lambda: torch.mm(a, a, out=c)), (lambda: torch.add(x, y, out=z))


@functools.lru_cache(maxsize=None)
def _speed_profile(device: str, threads: int, matmul_n: int, elementwise_n: int,
                   min_run_time: float) -> tuple[DtypeSpeed, ...]:
    from .measure import fastest_time  # loads torch.utils.benchmark: only when measuring

    ops = {d: timed_ops(d, torch.device(device), matmul_n, elementwise_n) for d in SPEED_DTYPES}
    matmul, rounds = {}, []  # rounds: the memory-bound ratios to float32, one dict per round
    torch.set_num_threads(1)  # one core: a busy machine cannot stall a second thread every call
    try:
        with strict_fp32():
            for dtype, (mm, _) in ops.items():  # compute-bound: steady; the faster of two
                matmul[dtype] = min(fastest_time(mm, min_run_time=min_run_time) for _ in range(2))
            while len(rounds) < 3 or (len(rounds) < 5 and _median([max(r.values()) for r in rounds])
                                      > MAX_MEMORY_RATIO):  # memory-bound: 3 rounds, 5 if noisy
                add = {d: fastest_time(ops[d][1], min_run_time=min_run_time / 3) for d in ops}
                rounds.append({d: add[torch.float32] / add[d] for d in SPEED_DTYPES[1:]})
    finally:
        torch.set_num_threads(threads)
    profile = [DtypeSpeed("float32", 1.0, 1.0, "the baseline")]
    for dtype in SPEED_DTYPES[1:]:
        mm, ew = matmul[torch.float32] / matmul[dtype], _median([r[dtype] for r in rounds])
        ew = ew if ew <= MAX_MEMORY_RATIO else math.nan  # beyond physics: noise, not a finding
        profile.append(DtypeSpeed(str(dtype)[6:], mm, ew, speed_verdict(mm, ew, matmul_n)))
    return tuple(profile)


def _machine_key(device: torch.device, matmul_n: int, elementwise_n: int) -> str:
    """What a cached profile is valid for: benchmark version, hardware, kernels, threads, sizes."""
    if device.type == "cuda":
        capability = "sm_%d%d" % torch.cuda.get_device_capability(device)
        hardware = f"{torch.cuda.get_device_name(device)} {capability}"
    else:
        isa = {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16"}
        flags = "+".join(sorted(cpu_flags() & isa))
        hardware = f"{platform.machine()} {platform.processor()} {flags}"
    kernels = " ".join([torch.backends.cpu.get_cpu_capability()] + [
        f"{v}={os.environ.get(v)}" for v in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")])
    return (f"v{CACHE_VERSION}|{device.type}|{hardware}|{kernels}|torch {torch.__version__}|"
            f"{torch.get_num_threads()} threads|{matmul_n}|{elementwise_n}")


def speed_cache_path() -> Path:
    """Where profiles are kept: ``$AMP_COURSE_CACHE`` or ``~/.cache/amp-course``."""
    root = os.environ.get("AMP_COURSE_CACHE") or Path.home() / ".cache" / "amp-course"
    return Path(root) / "speed_profile.json"


def speed_profile(device: str | torch.device = "cpu", *, matmul_n: int | None = None,
                  elementwise_n: int | None = None, min_run_time: float = 0.03,
                  refresh: bool = False) -> dict[str, DtypeSpeed]:
    """Each dtype's :class:`DtypeSpeed` on ``device`` from :func:`timed_ops` (a ratio beyond
    ``MAX_MEMORY_RATIO``: measured again, then NaN); cached by :func:`_machine_key`; 00 §1."""
    device = torch.device(device)
    defaults = default_sizes(device)
    matmul_n, elementwise_n = matmul_n or defaults[0], elementwise_n or defaults[1]
    key, path = _machine_key(device, matmul_n, elementwise_n), speed_cache_path()
    try:
        cache = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        cache = {}
    if refresh:
        _speed_profile.cache_clear()
    elif key in cache:
        return {name: DtypeSpeed(name, mm, ew, "the baseline" if name == "float32" else
                                 speed_verdict(mm, ew, matmul_n))
                for name, (mm, ew) in cache[key].items()}
    profile = {s.dtype: s for s in _speed_profile(str(device), torch.get_num_threads(), matmul_n,
                                                  elementwise_n, min_run_time)}
    cache[key] = {name: (s.matmul_speedup, s.elementwise_speedup) for name, s in profile.items()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cache, indent=1))
    except OSError:  # a read-only home: measure again next time
        pass
    return profile


def workload(dtype: torch.dtype | str, full: int, reduced: int,
             device: str | torch.device = "cpu") -> int:
    """``reduced`` where ``dtype``'s matmuls are emulated on ``device``, else ``full``; 00 §2."""
    name = str(dtype).removeprefix("torch.")
    return reduced if name != "float32" and speed_profile(device)[name].emulated else full


@dataclass(frozen=True)
class Recommendation:
    """What to use on one device per workload shape (:func:`recommendation`)."""

    decoding: str  # batch 1, token by token: memory-bound, the weights' bytes decide
    batched: str  # batched inference: compute-bound, 16-bit units decide
    training: str
    reason: str

    def __str__(self) -> str:
        return "\n".join(f"{label:>34}: {text}" for label, text in (
            ("batch-1 / decoding (memory-bound)", self.decoding),
            ("batched inference", self.batched), ("training", self.training),
            ("because", self.reason)))


def recommendation(profile: dict[str, DtypeSpeed], device: str | torch.device) -> Recommendation:
    """What to use on ``device`` per workload shape, from ``profile`` (batched: the fast 16-bit
    dtype autocast accepts, bf16 first; decoding: the lighter weights). Notebooks 00 §1, 07 §1."""
    device = torch.device(device)
    allowed = [str(d)[6:] for d in supported_autocast_dtypes(device.type)]
    fast = [n for n in ("bfloat16", "float16") if n in allowed and profile[n].compute_is_fast]
    if device.type == "cuda":
        fast = [n for n in fast if n == str(autocast_dtype(device))[6:]]
    bonus = {"bfloat16": 1.1, "float16": 1.0}  # bf16 unless fp16 is >10 % faster: no GradScaler
    pick = max(fast, key=lambda n: profile[n].matmul_speedup * bonus[n], default=None)
    lighter = [n for n in allowed if profile[n].elementwise_speedup >= 1.1]
    light = pick or max(lighter, key=lambda n: profile[n].elementwise_speedup * bonus[n],
                        default=None)
    bf16, fp16 = profile["bfloat16"], profile["float16"]
    reason = (f"compute-bound matmul: bf16 {bf16.matmul_speedup:.2f}x, fp16 "
              f"{fp16.matmul_speedup:.2f}x float32; memory-bound add: bf16 "
              f"{bf16.elementwise_speedup:.2f}x, fp16 {fp16.elementwise_speedup:.2f}x")
    decoding = (f"{light} weights (`model.to(torch.{light})`): half the bytes to read per token"
                if light else "float32 (16-bit weights measured no faster here; they halve memory)")
    if pick is None:
        return Recommendation(decoding, "float32 (no fast 16-bit matmul units here)", "float32",
                              reason)
    scaler = (f"and torch.amp.GradScaler({device.type!r})" if pick == "float16"
              else "no GradScaler (bf16 has float32's range)")
    return Recommendation(decoding, f"torch.amp.autocast({device.type!r}, dtype=torch.{pick})",
                          f"the same autocast, float32 weights, {scaler}", reason)
