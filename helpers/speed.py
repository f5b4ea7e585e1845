"""16-bit speed here (:func:`speed_profile`), work sized to it, what to use; notebook 00 §1-2."""
from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

from .device import autocast_dtype, cpu_flags, strict_fp32, supported_autocast_dtypes

CACHE_VERSION = 3  # v3: a batch-1 F.linear past the cache; >= 5 calls per memory-bound timing
SPEED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FAST_RATIO = 0.9  # within ~10 % of float32 or better: "fast" (timing noise on a busy laptop)
EMULATED_RATIO = 0.33  # 3x slower than float32 or worse: no 16-bit units for this dtype here
MAX_MEMORY_RATIO = 3.0  # half the bytes: about 2x (2.4x seen on one core); beyond 3x is noise
MIN_MEMORY_RATIO = 0.7  # an add of half the bytes 30 % slower than float32's: noise too


@dataclass(frozen=True)
class DtypeSpeed:
    """One dtype's measured speed relative to float32 on one device (above 1: faster)."""

    dtype: str
    matmul_speedup: float  # compute-bound: float32 time / this dtype's time, n x n matmul
    elementwise_speedup: float  # memory-bound: the same for adding two long vectors (NaN: noise)
    verdict: str  # the plain-words reading of the ratios
    decode_speedup: float = math.nan  # batch-1 F.linear, weights past the cache (NaN: noise)

    @property
    def compute_is_fast(self) -> bool:  # compute-bound matmuls about as fast as float32's or faster
        return self.matmul_speedup >= FAST_RATIO

    @property
    def emulated(self) -> bool:  # compute-bound matmuls 3x slower than float32's or worse
        return self.matmul_speedup < EMULATED_RATIO


def speed_verdict(matmul: float, ew: float, matmul_n: int = 256, dec: float | None = None) -> str:
    """Words for the ratios to float32 (matmul, add, batch-1 F.linear; :class:`DtypeSpeed`)."""
    mm = f"{matmul_n}x{matmul_n} matmul (compute-bound)"
    if matmul >= 1.2:
        compute = f"native 16-bit math: {mm} {matmul:.1f}x faster than float32"
    elif matmul >= FAST_RATIO:
        compute = f"{mm} about as fast as float32 ({matmul:.2f}x)"
    elif matmul >= EMULATED_RATIO:
        compute = f"{mm} {1 / matmul:.1f}x slower than float32"
    else:
        compute = f"emulated: {mm} {1 / matmul:.0f}x slower than float32"
    memory = ("memory-bound ops: timings disagreed (noise), measure again" if math.isnan(ew) else
              f"memory-bound ops {ew:.1f}x faster (half the bytes)" if ew >= 1.1 else
              f"memory-bound ops {ew:.2f}x float32")
    batch1 = "" if dec is None else "; batch-1 F.linear: timings disagreed, measure again" \
        if math.isnan(dec) else f"; batch-1 F.linear {dec:.2f}x"
    return f"{compute}; {memory}{batch1}"


def last_level_cache_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache"),
                           default: int = 32 << 20) -> int:
    """The largest CPU cache, from Linux's sysfs; ``default`` (32 MiB) where it cannot be read."""
    sizes = []
    for path in root.glob("index*/size"):
        text = path.read_text().strip().upper()
        sizes.append(int(text.rstrip("KM")) << {"K": 10, "M": 20}.get(text[-1:], 0))
    return max(sizes, default=default)


def default_sizes(device: str | torch.device) -> tuple[int, int]:
    """(n x n matmul, add's elements); CPU: a 16-bit vector 2x the LLC, at most 1.5 GB in fp32."""
    if torch.device(device).type in ("cuda", "mps"):
        return 4096, 1 << 26
    return 256, min(max(1 << 22, last_level_cache_bytes()), 1 << 27)


def decode_side(elementwise_n: int) -> int:
    """k of the k x k batch-1 weight: k * k >= ``elementwise_n``, past the cache as an add is."""
    return 64 * math.ceil(math.sqrt(elementwise_n) / 64)


def timed_ops(dtype: torch.dtype, device: torch.device, matmul_n: int, elementwise_n: int):
    """Matmul, add, batch-1 F.linear (``x @ w.T``), into outputs made here: the timer sees none."""
    generator, k = torch.Generator(device).manual_seed(0), decode_side(elementwise_n)
    a = torch.randn(matmul_n, matmul_n, device=device, generator=generator).to(dtype)
    x, y = torch.ones(2, elementwise_n, device=device, dtype=dtype)  # values: no matter to an add
    w, v = torch.full((k, k), 0.01, device=device, dtype=dtype), x[:k].view(1, k)
    c, z, out = torch.empty_like(a), torch.empty_like(x), torch.empty_like(v)
    return (lambda: torch.mm(a, a, out=c)), (lambda: torch.add(x, y, out=z)), \
        (lambda: torch.mm(v, w.t(), out=out))


def fastest_of(fn, calls: int = 5, min_run_time: float = 0.01) -> float:
    """Fastest of >= ``calls`` timings (single calls after a warm-up; time_it's blocks); 00 §1-2."""
    from .measure import benchmark, time_it  # loads torch.utils.benchmark: only when measuring

    timer = benchmark.Timer("fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    times = list(timer.blocked_autorange(min_run_time=0).times)  # one warm-up, one timed call
    if times[0] < min_run_time / 20:  # quick: a single call would time the timer too
        times += time_it(fn, min_run_time=min_run_time).times
    while len(times) < calls:
        times += timer.blocked_autorange(min_run_time=0).times  # one warm-up, one timed call
    return min(times)


@functools.lru_cache(maxsize=None)
def _speed_profile(device: str, threads: int, matmul_n: int, elementwise_n: int,
                   min_run_time: float) -> tuple[DtypeSpeed, ...]:
    t, low = {}, (0, MIN_MEMORY_RATIO, 0.0)  # seconds per (dtype, op); an emulated batch-1: slow
    ok = lambda d, op: low[op] <= t[torch.float32, op] / t[d, op] <= MAX_MEMORY_RATIO  # noqa: E731
    torch.set_num_threads(1)  # one core: a busy machine cannot stall a second thread every call
    try:
        with strict_fp32():
            for dtype in SPEED_DTYPES:  # one dtype's tensors in memory at a time
                ops = enumerate(timed_ops(dtype, torch.device(device), matmul_n, elementwise_n))
                t.update({(dtype, op): fastest_of(fn, min_run_time=min_run_time) for op, fn in ops})
            for dtype, op in [(d, op) for d in SPEED_DTYPES[1:] for op in (1, 2) if not ok(d, op)]:
                for d in (torch.float32, dtype):  # implausible: 5 more calls each, then noise
                    again = timed_ops(d, torch.device(device), 8, elementwise_n)[op]
                    t[d, op] = min(t[d, op], fastest_of(again))
    finally:
        torch.set_num_threads(threads)
    profile = [DtypeSpeed("float32", 1.0, 1.0, "the baseline", 1.0)]
    for d in SPEED_DTYPES[1:]:
        mm, ew, dec = (t[torch.float32, op] / t[d, op] if op == 0 or ok(d, op) else math.nan
                       for op in range(3))
        profile.append(DtypeSpeed(str(d)[6:], mm, ew, speed_verdict(mm, ew, matmul_n, dec), dec))
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
    """Each dtype's :class:`DtypeSpeed` from :func:`timed_ops` (an implausible memory-bound ratio:
    measured again, then NaN); cached by :func:`_machine_key`; notebook 00 §1."""
    device = torch.device(device)
    matmul_n, elementwise_n = (given or default for given, default in
                               zip((matmul_n, elementwise_n), default_sizes(device)))
    key, path = _machine_key(device, matmul_n, elementwise_n), speed_cache_path()
    cache = {}
    with contextlib.suppress(OSError, ValueError):  # none yet, or unreadable: measure
        cache = json.loads(path.read_text())
    if refresh:
        _speed_profile.cache_clear()
    elif key in cache:
        return {name: DtypeSpeed(name, mm, ew, "the baseline" if name == "float32" else
                                 speed_verdict(mm, ew, matmul_n, dec), dec)
                for name, (mm, ew, dec) in cache[key].items()}
    profile = {s.dtype: s for s in _speed_profile(str(device), torch.get_num_threads(), matmul_n,
                                                  elementwise_n, min_run_time)}
    cache[key] = {n: (s.matmul_speedup, s.elementwise_speedup, s.decode_speedup)
                  for n, s in profile.items()}
    with contextlib.suppress(OSError):  # a read-only home: measure again next time
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cache, indent=1))
    return profile


def workload(dtype: torch.dtype | str, full: int, reduced: int,
             device: str | torch.device = "cpu") -> int:
    """``reduced`` where ``dtype``'s matmuls are emulated on ``device``, else ``full``; 00 §2."""
    name = str(dtype).removeprefix("torch.")
    return reduced if name != "float32" and speed_profile(device)[name].emulated else full


@dataclass(frozen=True)
class Recommendation:
    """What to use on one device per workload shape (:func:`recommendation`)."""

    decoding: str  # batch 1, token by token: from the measured batch-1 F.linear
    batched: str  # batched inference: compute-bound, 16-bit units decide
    training: str
    reason: str

    def __str__(self) -> str:
        return "\n".join(f"{label:>34}: {text}" for label, text in (
            ("batch-1 / decoding (memory-bound)", self.decoding),
            ("batched inference", self.batched), ("training", self.training),
            ("because", self.reason)))


def recommendation(profile: dict[str, DtypeSpeed], device: str | torch.device) -> Recommendation:
    """Per workload shape, from ``profile``: batched, the fast dtype autocast accepts; decoding, the
    faster batch-1 weights; bf16 unless fp16 is >10 % faster. Notebooks 00 §1, 07 §1."""
    device = torch.device(device)
    allowed = [str(d)[6:] for d in supported_autocast_dtypes(device.type)]
    fast = [n for n in ("bfloat16", "float16") if n in allowed and profile[n].compute_is_fast]
    if device.type == "cuda":
        fast = [n for n in fast if n == str(autocast_dtype(device))[6:]]
    bonus = {"bfloat16": 1.1, "float16": 1.0}  # bf16 unless fp16 is >10 % faster: no GradScaler
    pick = max(fast, key=lambda n: profile[n].matmul_speedup * bonus[n], default=None)
    faster = [n for n in allowed if profile[n].decode_speedup >= 1.1]
    light = max(faster, key=lambda n: profile[n].decode_speedup * bonus[n], default=None)
    reason = "; ".join(f"{what}: bf16 {getattr(profile['bfloat16'], field):.2f}x, fp16 "
                       f"{getattr(profile['float16'], field):.2f}x float32" for what, field in (
        ("compute-bound matmul", "matmul_speedup"), ("memory-bound add", "elementwise_speedup"),
        ("batch-1 F.linear", "decode_speedup")))
    decoding = (f"{light} weights (`model.to(torch.{light})`): batch-1 F.linear "
                f"{profile[light].decode_speedup:.2f}x float32 here" if light else
                "timings disagreed: measure again (`speed_profile(device, refresh=True)`)"
                if allowed and all(math.isnan(profile[n].decode_speedup) for n in allowed) else
                "float32 (16-bit weights measured no faster at batch 1 here; they halve memory)")
    if pick is None:
        return Recommendation(decoding, "float32 (no fast 16-bit matmul units here)", "float32",
                              reason)
    scaler = (f"and torch.amp.GradScaler({device.type!r})" if pick == "float16"
              else "no GradScaler (bf16 has float32's range)")
    return Recommendation(decoding, f"torch.amp.autocast({device.type!r}, dtype=torch.{pick})",
                          f"the same autocast, float32 weights, {scaler}", reason)
