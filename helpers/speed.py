"""How fast each 16-bit dtype is on this device, measured: :func:`speed_profile` (cached per machine and kernel
choice) and :func:`workload`, which sizes down work in a dtype this machine emulates. Taught in notebook 00 §1-2;
every "is bf16 fast here?" branch of the course asks it."""
from __future__ import annotations

import functools
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

from .device import cpu_flags, strict_fp32


@dataclass(frozen=True)
class DtypeSpeed:
    """One dtype's measured speed relative to float32 on one device (ratios > 1 mean faster than float32)."""

    dtype: str
    matmul_speedup: float       # compute-bound: float32 time / this dtype's time for an n x n matmul
    elementwise_speedup: float  # memory-bound: the same for adding two large tensors
    verdict: str                # the plain-words reading of the two ratios

    @property
    def compute_is_fast(self) -> bool:
        """True when this dtype's matmuls are at least as fast as float32's (native 16-bit units)."""
        return self.matmul_speedup >= FAST_RATIO

    @property
    def emulated(self) -> bool:
        """True when matmuls in this dtype are much slower than float32 (converted through float32 in software)."""
        return self.matmul_speedup < EMULATED_RATIO


FAST_RATIO = 0.9       # within ~10 % of float32 or better counts as "fast" (timing noise on a busy laptop)
EMULATED_RATIO = 0.33  # 3x slower than float32 or worse: no 16-bit units for this dtype here


def speed_verdict(matmul_speedup: float, elementwise_speedup: float) -> str:
    """Words for a dtype's two measured ratios to float32 (see :class:`DtypeSpeed`)."""
    if matmul_speedup >= 1.2:
        compute = f"native 16-bit math: matmul {matmul_speedup:.1f}x faster than float32"
    elif matmul_speedup >= FAST_RATIO:
        compute = f"matmul about as fast as float32 ({matmul_speedup:.2f}x)"
    elif matmul_speedup >= EMULATED_RATIO:
        compute = f"matmul {1 / matmul_speedup:.1f}x slower than float32"
    else:
        compute = f"emulated: matmul {1 / matmul_speedup:.0f}x slower than float32"
    memory = (f"memory-bound ops {elementwise_speedup:.1f}x faster (half the bytes)" if elementwise_speedup >= 1.1
              else f"memory-bound ops {elementwise_speedup:.2f}x float32")
    return f"{compute}; {memory}"


@functools.lru_cache(maxsize=None)
def _speed_profile(device: str, threads: int, matmul_n: int, elementwise_n: int,
                   min_run_time: float) -> tuple[DtypeSpeed, ...]:
    from .measure import fastest_time  # measure imports torch.utils.benchmark: load it only when measuring

    device_ = torch.device(device)
    generator = torch.Generator(device_).manual_seed(0)
    a32 = torch.randn(matmul_n, matmul_n, device=device_, generator=generator)
    v32 = torch.randn(elementwise_n, device=device_, generator=generator)
    times = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        a, v = a32.to(dtype), v32.to(dtype)
        with strict_fp32():
            times[dtype] = (fastest_time(lambda: a @ a, min_run_time=min_run_time),
                            fastest_time(lambda: v + v, min_run_time=min_run_time))
    base_mm, base_ew = times[torch.float32]
    profile = [DtypeSpeed("float32", 1.0, 1.0, "the baseline")]
    for dtype in (torch.bfloat16, torch.float16):
        mm, ew = base_mm / times[dtype][0], base_ew / times[dtype][1]
        profile.append(DtypeSpeed(str(dtype).removeprefix("torch."), mm, ew, speed_verdict(mm, ew)))
    return tuple(profile)


def _machine_key(device: torch.device, matmul_n: int, elementwise_n: int) -> str:
    """What a cached profile is valid for: the hardware, the kernels torch may use, the thread count, the sizes."""
    if device.type == "cuda":
        hardware = f"{torch.cuda.get_device_name(device)} sm_%d%d" % torch.cuda.get_device_capability(device)
    else:
        flags = sorted(cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16"})
        hardware = f"{platform.machine()} {platform.processor()} {'+'.join(flags)}"
    kernels = (f"{torch.backends.cpu.get_cpu_capability()} ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY')}"
               f" ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA')}")
    return (f"{device.type}|{hardware}|{kernels}|torch {torch.__version__}|{torch.get_num_threads()} threads|"
            f"{matmul_n}|{elementwise_n}")


def speed_cache_path() -> Path:
    """Where measured profiles are kept between runs: ``$AMP_COURSE_CACHE`` or ``~/.cache/amp-course``."""
    root = os.environ.get("AMP_COURSE_CACHE") or Path.home() / ".cache" / "amp-course"
    return Path(root) / "speed_profile.json"


def speed_profile(device: str | torch.device = "cpu", *, matmul_n: int | None = None,
                  elementwise_n: int | None = None, min_run_time: float = 0.03,
                  refresh: bool = False) -> dict[str, DtypeSpeed]:
    """Measure, on ``device``, how fast bfloat16 and float16 are relative to float32; cached.

    Two micro-benchmarks per dtype (``torch.utils.benchmark``, well under a second in all): an ``n x n`` matmul
    (compute-bound: only 16-bit arithmetic units make it faster) and the sum of two long vectors (memory-bound: half
    the bytes is faster even where the arithmetic is emulated). Returns ``{"float32": ..., "bfloat16": ...,
    "float16": ...}`` of :class:`DtypeSpeed`, verdicts included. This is what every "is bf16 fast here?" branch of
    the course asks; CPU flags only explain the answer (:func:`fast_dtypes`).

    The ratios are kept per process and in a small JSON file (:func:`speed_cache_path`) keyed by the hardware, the
    kernels torch may use (``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``), the torch version and the thread
    count, so each notebook does not measure again; ``refresh=True`` measures now and updates the file.
    """
    device = torch.device(device)
    defaults = (4096, 1 << 26) if device.type == "cuda" else (256, 1 << 22)
    matmul_n, elementwise_n = matmul_n or defaults[0], elementwise_n or defaults[1]
    key, path = _machine_key(device, matmul_n, elementwise_n), speed_cache_path()
    try:
        cache = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        cache = {}
    if refresh:
        _speed_profile.cache_clear()
    elif key in cache:
        return {name: DtypeSpeed(name, mm, ew, "the baseline" if name == "float32" else speed_verdict(mm, ew))
                for name, (mm, ew) in cache[key].items()}
    profile = {speed.dtype: speed for speed in _speed_profile(str(device), torch.get_num_threads(), matmul_n,
                                                               elementwise_n, min_run_time)}
    cache[key] = {name: (s.matmul_speedup, s.elementwise_speedup) for name, s in profile.items()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cache, indent=1))
    except OSError:  # a read-only home: measure again next time
        pass
    return profile


def workload(dtype: torch.dtype | str, full: int, reduced: int, device: str | torch.device = "cpu") -> int:
    """``reduced`` where ``dtype`` is emulated on ``device`` (:attr:`DtypeSpeed.emulated`), else ``full``.

    Experiments that run a dtype this machine emulates (fp16 on most CPUs, bf16 on AVX2-only CPUs: matmuls 30 to
    100 times slower than float32) shrink their work this way, so that every learner's run (and ``pytest``) stays
    fast while the claim is still checked. A dtype within a few times float32's speed keeps the full work; the
    line is far from both kinds, so timing noise does not flip the choice (fp16 on a CPU with AVX512-FP16 measures
    0.8 to 1.0 times float32, near the "fast" line).
    """
    name = str(dtype).removeprefix("torch.")
    if name == "float32":
        return full
    return reduced if speed_profile(device)[name].emulated else full
