"""Pick a device and an autocast dtype; the TF32 switches; what the hardware reports (00)."""

import contextlib
import io
import logging
import os
import platform
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import torch

from . import precision
from .precision import SIXTEEN_BIT_FLAGS, choose_precision, describe_device, native_dtypes


def _import_cpp_extension_quietly() -> None:
    """Import ``torch.utils.cpp_extension`` without torch 2.4's "No CUDA runtime" line (2.4.1 prints
    it on a CPU machine when ``torch.utils.benchmark``, which helpers.measure imports, loads it)."""
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    captured = io.StringIO()
    with contextlib.redirect_stderr(captured):
        import torch.utils.cpp_extension  # noqa: F401
    lines = captured.getvalue().splitlines(keepends=True)
    sys.stderr.write("".join(line for line in lines if not line.startswith("No CUDA runtime")))


_import_cpp_extension_quietly()

KNOWN_DEVICE_TYPES = ("cpu", "cuda", "mps")
DEVICE_SWITCH = "AMP_COURSE_DEVICE"  # AMP_COURSE_DEVICE=cpu: every notebook on the CPU (the playbook)
MPS_UNTESTED = "untested here: no Mac run is recorded in data/"  # said wherever MPS is chosen


def _version_at_least(version: str, wanted: tuple[int, int]) -> bool:
    major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    return (major, minor) >= wanted


def _device_available(device_type: str) -> bool:
    if device_type == "cuda":
        return torch.cuda.is_available()
    if device_type == "mps":
        return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    return device_type == "cpu"


def _mps_trains_16_bit() -> bool:
    """True where the rule trains in 16 bits on this Mac's GPU: on no torch until a Mac run is
    recorded in data/ (the rule says measure there), so only a learner's choice picks MPS."""
    return choose_precision(describe_device("mps"))["training"].dtype == torch.float16


def pick_device(preferred: str | torch.device | None = None) -> torch.device:
    """``preferred`` after checking it, else the :data:`DEVICE_SWITCH` environment variable's device,
    else the best: CUDA, then MPS where the rule trains in 16 bits there (nowhere yet: MPS is
    untested here, ``AMP_COURSE_DEVICE=mps`` opts in), then CPU; 00 §1."""
    preferred = preferred or os.environ.get(DEVICE_SWITCH) or None
    if preferred is None and _device_available("cuda"):
        return torch.device("cuda")
    if preferred is None and _device_available("mps") and _mps_trains_16_bit():
        return torch.device("mps")  # not while the rule says measure there (helpers.precision)
    if preferred is None:
        return torch.device("cpu")
    choices = f"use one of {', '.join(KNOWN_DEVICE_TYPES)}, or pick_device() for the best one"
    try:
        device = torch.device(preferred)
    except RuntimeError as error:
        raise ValueError(f"Unknown device {preferred!r}: {choices}.") from error
    if device.type not in KNOWN_DEVICE_TYPES:
        raise ValueError(f"Device type {device.type!r} is not covered by this course: {choices}.")
    if not _device_available(device.type):
        raise RuntimeError(f"No {device.type} device is available on this machine: use 'cpu'.")
    return device


def supported_autocast_dtypes(device_type: str) -> tuple[torch.dtype, ...]:
    """The dtypes autocast on ``device_type`` accepts (CUDA: bf16 if emulated too); 03 §2."""
    if device_type == "cpu":
        fp16 = _version_at_least(torch.__version__, (2, 2))
        return (torch.bfloat16, torch.float16) if fp16 else (torch.bfloat16,)
    if device_type == "cuda":
        bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return (torch.float16, torch.bfloat16) if bf16 else (torch.float16,)
    if device_type == "mps":  # fp16 since MPS autocast came; bf16 from torch 2.6 (pytorch#139390)
        is_available = getattr(torch.amp.autocast_mode, "is_autocast_available", None)
        if is_available is None or not is_available("mps"):
            return ()
        return (torch.float16,) + (torch.bfloat16,) * _version_at_least(torch.__version__, (2, 6))
    raise ValueError(f"Unknown device type {device_type!r}: use one of {KNOWN_DEVICE_TYPES}")


def check_autocast_dtype(device_type: str, dtype: torch.dtype) -> torch.dtype:
    """``dtype`` if autocast on ``device_type`` supports it, else ValueError; 03 §2."""
    supported = supported_autocast_dtypes(device_type)
    if dtype not in supported:
        raise ValueError(f"autocast on {device_type!r} cannot use {dtype} with torch "
                         f"{torch.__version__}: it supports {supported}. See autocast_dtype().")
    return dtype


def cuda_native_bf16(device: str | torch.device = "cuda") -> bool:
    """True for bf16 tensor cores (sm_80 on; ``is_bf16_supported()``: also a T4); 03 §2."""
    if not torch.cuda.is_available():
        return False
    if getattr(torch.version, "hip", None):  # ROCm: AMD GPUs report their own support
        return bool(torch.cuda.is_bf16_supported())
    return torch.cuda.get_device_capability(torch.device(device))[0] >= 8


def autocast_dtype(device: str | torch.device) -> torch.dtype:
    """The dtype the notebooks autocast to on ``device``; 00 §1. The rule's training dtype
    (helpers.precision) where it is 16-bit; where the rule says float32 or measure, the lessons
    still show autocast in the device's default dtype, emulated (CPU bf16, CUDA fp16), and say
    so. MPS, chosen by the learner: fp16 from torch 2.8 (GradScaler's MPS kernels), where the rule
    says measure (untested here); before that, no 16-bit training there."""
    device = torch.device(device)
    if not supported_autocast_dtypes(device.type):
        raise ValueError(f"torch {torch.__version__} has no autocast for {device.type!r}: "
                         f"upgrade it or use the CPU ({DEVICE_SWITCH}=cpu).")
    training = choose_precision(describe_device(device))["training"]
    if training.dtype in (torch.bfloat16, torch.float16):
        return training.dtype
    if device.type == "mps" and _version_at_least(torch.__version__, (2, 8)):
        return torch.float16  # chosen by the learner, the rule says measure: the lessons show fp16
    if device.type == "mps":
        raise ValueError(f"torch {torch.__version__} cannot train in 16 bits on MPS "
                         f"({training.reason}): upgrade torch to 2.8 or later, or use the CPU "
                         f"({DEVICE_SWITCH}=cpu).")
    return torch.bfloat16 if device.type == "cpu" else torch.float16


def needs_grad_scaler(amp_dtype: torch.dtype | None) -> bool:
    """True for float16 (bf16 has float32's range): training needs a ``GradScaler``; notebook 04."""
    return amp_dtype == torch.float16


TF32_ENV = ("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "NVIDIA_TF32_OVERRIDE")  # NGC images set the first
LEGACY_TF32 = ("torch.get_float32_matmul_precision()", "torch.backends.cuda.matmul.allow_tf32",
               "torch.backends.cudnn.allow_tf32")


def _new_tf32_api() -> list[tuple[str, object]]:
    """``(name, holder)`` of each ``fp32_precision`` setting (torch >= 2.9)."""
    holders = []
    for suffix in ("", ".cuda.matmul", ".cudnn", ".cudnn.conv", ".cudnn.rnn"):
        holder = torch.backends
        for part in suffix.split(".")[1:]:
            holder = getattr(holder, part, None)
        if hasattr(holder, "fp32_precision"):
            holders.append((f"torch.backends{suffix}.fp32_precision", holder))
    return holders


def _legacy_tf32() -> tuple[str, bool, bool] | None:
    """The legacy view (:data:`LEGACY_TF32`), or None where reading it raises (mixed APIs)."""
    try:
        return (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,
                torch.backends.cudnn.allow_tf32)
    except RuntimeError:
        return None


def tf32_settings() -> dict[str, object]:
    """The TF32 environment variables and switches (new API; legacy view if readable)."""
    settings: dict[str, object] = {name: os.environ.get(name, "unset") for name in TF32_ENV}
    settings.update({name: holder.fp32_precision for name, holder in _new_tf32_api()})
    unreadable = ["unreadable (fp32_precision set: mixing APIs raises)"] * 3
    settings.update(zip(LEGACY_TF32, _legacy_tf32() or unreadable))
    return settings


@contextlib.contextmanager
def tf32_flags(enabled: bool) -> Iterator[None]:
    """TF32 for CUDA matmuls and cuDNN on or off in the block (both views in step); 00 §9."""
    new, legacy = [(holder, holder.fp32_precision) for _, holder in _new_tf32_api()], _legacy_tf32()
    torch.set_float32_matmul_precision("high" if enabled else "highest")  # both views in step
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        if legacy is not None:
            torch.set_float32_matmul_precision(legacy[0])
            torch.backends.cudnn.allow_tf32 = legacy[2]
        for holder, value in new:
            holder.fp32_precision = value


def strict_fp32() -> contextlib.AbstractContextManager:
    """A block in which float32 is float32 on every device (TF32 off); notebook 00 §9."""
    return tf32_flags(False)


class AutocastState(NamedTuple):
    """What autocast would do for one device type in the calling thread."""
    enabled: bool
    dtype: torch.dtype  # the dtype autocast casts to (the device's default unless a context set it)


def autocast_state(device_type: str = "cpu") -> AutocastState:
    """The calling thread's autocast state for ``device_type`` (thread-local); notebook 05 §3."""
    enabled = torch.is_autocast_enabled(device_type)  # device-generic from torch 2.4
    return AutocastState(enabled, torch.get_autocast_dtype(device_type))


@contextlib.contextmanager
def quiet_native_stderr() -> Iterator[None]:
    """Drop what C++ code writes to stderr (fd 2) in the block (profiler logs); notebook 00 A.2."""
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _cpuinfo(key: str) -> list[str]:
    """The values of ``key`` lines in /proc/cpuinfo (none where it does not exist, e.g. macOS)."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    return [line.split(":", 1)[1].strip() for line in lines if line.startswith(key)]


def cpu_flags() -> set[str]:
    """Every CPU feature flag in /proc/cpuinfo (empty where that file does not exist), for the
    benchmarks' records; the rule and the machine line read :func:`helpers.precision.cpu_flags`."""
    return set(next(iter(_cpuinfo("flags")), "").split())


def workload(dtype: torch.dtype | str, full: int, reduced: int,
             device: str | torch.device = "cpu") -> int:
    """``full`` where ``dtype`` is float32 or native on ``device`` (:func:`native_dtypes`), else
    ``reduced`` (emulated, or unknown): sizes work by rule, never by a measurement."""
    name = str(dtype).removeprefix("torch.")
    native = [str(d).removeprefix("torch.") for d in native_dtypes(describe_device(device))]
    if name == "float32" or name in native:
        return full
    return reduced


def environment_report(device: str | torch.device | None = None) -> dict[str, str]:
    """Versions, the chosen device and its autocast dtype, as strings (notebook 00 §1)."""
    from importlib import metadata
    device = pick_device(device)
    try:  # the installed version, without importing torchvision (seconds on a laptop)
        torchvision = metadata.version("torchvision")
    except metadata.PackageNotFoundError:  # pragma: no cover - torchvision is in requirements.txt
        torchvision = "not installed"
    report = {"python": platform.python_version(), "torch": torch.__version__,
              "torchvision": torchvision, "device": str(device),
              "cpu threads": str(torch.get_num_threads()),
              "cpu vector ISA (torch)": torch.backends.cpu.get_cpu_capability(),
              "cpu 16-bit flags (the rule's)": _sixteen_bit_flags(),
              "cuda available": str(torch.cuda.is_available()),
              "autocast dtype here": str(autocast_dtype(device))}
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(device)
        report["compute capability"] = "%d.%d" % torch.cuda.get_device_capability(device)
    return report


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo, else ``platform.processor()``), e.g. "AMD EPYC"."""
    names = _cpuinfo("model name")
    return names[0] if names else platform.processor() or platform.machine() or "unknown CPU"


def last_level_cache_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache"),
                           default: int = 32 << 20) -> int:
    """The largest CPU cache, from Linux's sysfs; ``default`` (32 MiB) where it cannot be read."""
    texts = [path.read_text().strip().upper() for path in root.glob("index*/size")]
    return max((int(t.rstrip("KM")) << {"K": 10, "M": 20}.get(t[-1:], 0) for t in texts),
               default=default)


def _sixteen_bit_flags() -> str:
    """The CPU's 16-bit flags as the rule reads them (one reader: helpers.precision.cpu_flags)."""
    flags, source = precision.cpu_flags()
    if flags is None:
        return "CPU flags unreadable"
    shown = ", ".join(f for f in flags if f in SIXTEEN_BIT_FLAGS) or "no 16-bit CPU flags"
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA")
    return f"{shown} under ONEDNN_MAX_CPU_ISA={limit}" if "limited" in source else shown


def machine_stamp(device: str | torch.device | None = None) -> str:
    """One line naming the machine a notebook's outputs come from (each notebook's first cell)."""
    device = pick_device(device)
    if device.type == "cuda":
        where = "%s (sm_%d%d)" % (torch.cuda.get_device_name(device),
                                  *torch.cuda.get_device_capability(device))
    else:
        where = (f"{cpu_model()} ({_sixteen_bit_flags()}, "
                 f"{torch.backends.cpu.get_cpu_capability()} kernels)")
        where = f"Apple GPU (mps, {MPS_UNTESTED}) on {where}" if device.type == "mps" else where
    if os.environ.get(DEVICE_SWITCH):
        where = f"{where}, chosen by {DEVICE_SWITCH}={os.environ[DEVICE_SWITCH]}"
    return f"Outputs made on: {where}, {torch.get_num_threads()} threads, torch {torch.__version__}"
