"""Pick a device and an autocast dtype, and measure what this machine runs fast."""
from __future__ import annotations

import contextlib
import io
import logging
import platform
import sys
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
