"""Pick a device and an autocast dtype, and measure what this machine runs fast."""
from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, NamedTuple

import torch


def _import_cpp_extension_quietly() -> None:
    """Import ``torch.utils.cpp_extension`` (which ``torch.utils.benchmark``, hence :mod:`helpers.measure`, imports)
    without its "No CUDA runtime is found, using CUDA_HOME=..." line: on a machine with a CUDA toolkit but no GPU,
    torch 2.4 *prints* it to stderr at import and later releases log it. It says nothing about the course."""
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    captured = io.StringIO()
    with contextlib.redirect_stderr(captured):
        import torch.utils.cpp_extension  # noqa: F401
    other = [line for line in captured.getvalue().splitlines(keepends=True)
             if not line.startswith("No CUDA runtime is found")]
    sys.stderr.write("".join(other))  # anything else it printed still shows


_import_cpp_extension_quietly()

KNOWN_DEVICE_TYPES = ("cpu", "cuda", "mps")
X86_MACHINES = ("x86_64", "AMD64")  # platform.machine() on x86-64 Linux/macOS and Windows


def _version_at_least(version: str, wanted: tuple[int, int]) -> bool:
    major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    return (major, minor) >= wanted


def _device_available(device_type: str) -> bool:
    if device_type == "cpu":
        return True
    if device_type == "cuda":
        return torch.cuda.is_available()
    return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())


def pick_device(preferred: str | torch.device | None = None) -> torch.device:
    """Return ``preferred`` after checking it, or the best available device (CUDA, then MPS, then CPU).

    Raises ``ValueError`` for a device type PyTorch-on-this-course does not know, and ``RuntimeError``
    for a known one that this machine does not have, naming what to use instead.
    """
    if preferred is None:
        for device_type in ("cuda", "mps"):
            if _device_available(device_type):
                return torch.device(device_type)
        return torch.device("cpu")
    try:
        device = torch.device(preferred)
    except RuntimeError as error:
        raise ValueError(
            f"Unknown device {preferred!r}: use one of {', '.join(KNOWN_DEVICE_TYPES)} "
            "or call pick_device() with no argument to take the best available one."
        ) from error
    if device.type not in KNOWN_DEVICE_TYPES:
        raise ValueError(
            f"Device type {device.type!r} is not covered by this course: use one of "
            f"{', '.join(KNOWN_DEVICE_TYPES)}, or pick_device() for the best available one."
        )
    if not _device_available(device.type):
        raise RuntimeError(
            f"No {device.type} device is available on this machine: use 'cpu', "
            "or pick_device() to take the best device there is."
        )
    return device


def supported_autocast_dtypes(device_type: str) -> tuple[torch.dtype, ...]:
    """The low-precision dtypes that ``torch.amp.autocast(device_type, dtype=...)`` accepts here."""
    if device_type == "cpu":
        # CPU autocast: bfloat16 always; float16 since PyTorch 2.2.
        if _version_at_least(torch.__version__, (2, 2)):
            return (torch.bfloat16, torch.float16)
        return (torch.bfloat16,)
    if device_type == "cuda":
        # What autocast *accepts*: it takes bf16 wherever torch.cuda.is_bf16_supported() says yes, which by default
        # includes emulation (sm_70/sm_75). What the course *recommends* is autocast_dtype(): bf16 only where native.
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return (torch.float16, torch.bfloat16)
        return (torch.float16,)
    if device_type == "mps":
        # MPS autocast is recent (float16 first); ask this torch rather than assume.
        is_available = getattr(torch.amp.autocast_mode, "is_autocast_available", None)
        return (torch.float16,) if is_available is not None and is_available("mps") else ()
    raise ValueError(f"Unknown device type {device_type!r}: use one of {', '.join(KNOWN_DEVICE_TYPES)}.")


def check_autocast_dtype(device_type: str, dtype: torch.dtype) -> torch.dtype:
    """Return ``dtype`` if autocast on ``device_type`` supports it, else raise a ``ValueError`` naming the fix.

    PyTorch's own reaction differs by device: on CPU, ``torch.amp.autocast`` *warns* and disables itself for an
    unsupported dtype (the block then runs in float32); on CUDA it *raises* (e.g. bf16 on a GPU without bf16
    support). This check fails loudly and the same way on every device.
    """
    supported = supported_autocast_dtypes(device_type)
    if dtype not in supported:
        names = ", ".join(str(d) for d in supported)
        raise ValueError(
            f"autocast on {device_type!r} cannot use {dtype} with torch {torch.__version__}: "
            f"it supports {names}. Use autocast_dtype({device_type!r}) for the recommended one."
        )
    return dtype


def cuda_native_bf16(device: str | torch.device = "cuda") -> bool:
    """True for an NVIDIA GPU with bf16 tensor cores (compute capability 8.0, Ampere, and later).

    Not ``torch.cuda.is_bf16_supported()``: by default (``including_emulation=True``) it answers True on a V100
    (sm_70) or T4 (sm_75) too, where bf16 runs without tensor cores and is slower than fp16.
    """
    if not torch.cuda.is_available():
        return False
    if getattr(torch.version, "hip", None):  # ROCm: AMD GPUs report their own support
        return bool(torch.cuda.is_bf16_supported())
    return torch.cuda.get_device_capability(torch.device(device))[0] >= 8


def autocast_dtype(device: str | torch.device) -> torch.dtype:
    """The autocast dtype this course uses on ``device``.

    CPU: bfloat16 (autocast's CPU default; whether it is *fast* here is what :func:`speed_profile` measures).
    CUDA: bfloat16 on Ampere (sm_80) and later, float16 before (V100, T4: fp16 tensor cores, no bf16 ones; pair it
    with a ``GradScaler`` for training). MPS: float16. Raises ``ValueError`` where this torch has no autocast for
    the device at all.
    """
    device = torch.device(device)
    supported = supported_autocast_dtypes(device.type)
    if not supported:
        raise ValueError(f"torch {torch.__version__} has no autocast for {device.type!r}: upgrade torch or use 'cpu'.")
    if device.type == "cuda":
        return torch.bfloat16 if cuda_native_bf16(device) else torch.float16
    return torch.bfloat16 if torch.bfloat16 in supported else supported[0]


def needs_grad_scaler(amp_dtype: torch.dtype | None) -> bool:
    """True when training with this autocast dtype needs a ``GradScaler``: float16 only (bf16 has fp32's range)."""
    return amp_dtype == torch.float16


@contextlib.contextmanager
def tf32_flags(enabled: bool) -> Iterator[None]:
    """Set TF32 for CUDA matmuls and cuDNN convolutions to ``enabled`` inside the block, then restore both.

    PyTorch's defaults differ: ``torch.backends.cuda.matmul.allow_tf32`` is False (since 1.12) but
    ``torch.backends.cudnn.allow_tf32`` is True, so a "float32" convolution on an Ampere-or-later GPU runs in
    TF32 (inputs rounded to a 10-bit mantissa) unless it is turned off. The flags exist on every build and do
    nothing on a CPU.
    """
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def strict_fp32() -> contextlib.AbstractContextManager:
    """A block in which float32 really is float32 on every device (TF32 off for matmuls and cuDNN)."""
    return tf32_flags(False)


class AutocastState(NamedTuple):
    """What autocast would do for one device type in the calling thread."""

    enabled: bool
    dtype: torch.dtype  # the dtype autocast casts to (the device's default unless a context set it)


def autocast_state(device_type: str = "cpu") -> AutocastState:
    """The calling thread's autocast state for ``device_type`` (autocast state is thread-local).

    Uses the device-generic ``torch.is_autocast_enabled(device_type)``/``torch.get_autocast_dtype(device_type)``
    where this torch has them, else the older CPU/GPU-specific functions.
    """
    try:
        return AutocastState(torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type))
    except (AttributeError, TypeError):  # before the device-generic functions existed
        if device_type == "cpu":
            return AutocastState(torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype())
        return AutocastState(torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype())


def cpu_flags() -> set[str]:
    """CPU feature flags from /proc/cpuinfo (empty where that file does not exist, e.g. macOS)."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return set()
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


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


def fast_dtypes(device: str | torch.device) -> dict[str, str]:
    """For each of float32/bfloat16/float16: what the hardware *reports*, which explains a measured verdict.

    This is an explanation, not a verdict: :func:`speed_profile` measures. On x86 CPUs it reads the CPU flags; on
    other CPUs (ARM, ...) it says "unknown on this architecture: measure"; on CUDA it reads the compute capability.
    """
    device = torch.device(device)
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        name = torch.cuda.get_device_name(device)
        tensor_cores = major >= 7
        return {
            "float32": f"{name}: full speed FP32; TF32 tensor cores only if enabled" if major >= 8
            else f"{name}: full speed FP32",
            "float16": f"{name}: tensor cores (sm_{major}{minor}), fast" if tensor_cores
            else f"{name}: no tensor cores (sm_{major}{minor}); little gain",
            "bfloat16": f"{name}: tensor cores (sm_{major}{minor}), fast" if major >= 8
            else f"{name}: not supported natively before sm_80",
        }
    if device.type == "mps":
        return {"float32": "Apple GPU: baseline", "float16": "Apple GPU: fast", "bfloat16": "Apple GPU: recent macOS only"}
    machine = platform.machine()
    if machine not in X86_MACHINES:
        # ARM and other CPUs: fp16/bf16 arithmetic (e.g. ARMv8.2 FP16, SVE/NEON BF16) varies by chip and PyTorch
        # build, and /proc/cpuinfo flags say little about which kernels PyTorch uses: only a timing can tell.
        unknown = f"CPU ({machine or 'unknown architecture'}): unknown on this architecture: measure"
        return {"float32": "CPU: baseline (vectorised FP32)", "bfloat16": unknown, "float16": unknown}
    flags = cpu_flags()
    bf16 = {"avx512_bf16", "amx_bf16"} & flags
    fp16 = {"avx512_fp16", "amx_fp16"} & flags
    return {
        "float32": "CPU: baseline (vectorised FP32)",
        "bfloat16": f"CPU reports bf16 instructions ({', '.join(sorted(bf16))}): PyTorch's oneDNN kernels can use them"
        if bf16 else "CPU reports no avx512_bf16/amx_bf16: bf16 math is converted through fp32 (expect much SLOWER "
        "matmuls; memory-bound ops still gain from half the bytes)",
        "float16": f"CPU reports fp16 instructions ({', '.join(sorted(fp16))}): PyTorch's oneDNN kernels can use them"
        if fp16 else "CPU reports no avx512_fp16/amx_fp16: fp16 math is emulated through fp32 (expect much SLOWER "
        "matmuls; memory-bound ops still gain from half the bytes)",
    }


def environment_report(device: str | torch.device | None = None) -> dict[str, str]:
    """Versions, the chosen device and the autocast dtype for it, as a dict of strings to print."""
    device = pick_device(device)
    from importlib import metadata

    try:  # the installed version, without importing torchvision (a few seconds on a laptop)
        torchvision_version = metadata.version("torchvision")
    except metadata.PackageNotFoundError:  # pragma: no cover - torchvision is in requirements.txt
        torchvision_version = "not installed"
    report = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision_version,
        "device": str(device),
        "cpu threads": str(torch.get_num_threads()),
        "cpu vector ISA (torch)": torch.backends.cpu.get_cpu_capability(),
        "cuda available": str(torch.cuda.is_available()),
        "autocast dtype here": str(autocast_dtype(device)),
    }
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(device)
        report["compute capability"] = "%d.%d" % torch.cuda.get_device_capability(device)
    return report
