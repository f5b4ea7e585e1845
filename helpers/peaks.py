"""Datasheet peaks of NVIDIA GPUs (data/gpu_peaks.json), peak fractions, ridges; 01, 06, 08-10."""

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

PEAKS_FILE = Path(__file__).resolve().parent.parent / "data" / "gpu_peaks.json"
FORMATS = ("fp32", "tf32", "fp16", "bf16", "fp8")
_ALIASES = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16",
            "tensorfloat32": "tf32"}

GOOD_GEMM_FRACTION = 0.8  # of the dense 16-bit peak, a well-shaped large GEMM (source below)
GOOD_GEMM_SOURCE = (
    "S. Bekman, Machine Learning Engineering Open Book, 'Maximum Achievable Matmul FLOPS "
    "comparison table' (https://github.com/stas00/ml-engineering/tree/master/compute/accelerator), "
    "bf16 torch.matmul, best shape of a search, mean of 100 runs: H100 SXM 794.5 of 989 TFLOP/s "
    "(80.3 %), GH200 828.6 of 989 (83.8 %), A100 SXM 271.2 of 312 (86.9 %). A plain square GEMM of "
    "one size usually lands a few percent lower."
)


@dataclass(frozen=True)
class GpuPeak:
    """One GPU's datasheet figures (dense TFLOP/s per format; ``None``: no tensor cores for it)."""

    name: str
    architecture: str
    capability: str  # CUDA compute capability, e.g. "9.0"
    tflops: dict[str, float | None]
    memory_gb: float
    bandwidth_tb_s: float
    source: str  # title and URL of the NVIDIA document the figures come from
    match: tuple[str, ...] = ()  # regular expressions matched against torch.cuda.get_device_name()
    note: str = ""
    block_scaled_tflops: dict[str, float] = field(default_factory=dict)  # "mxfp8"...: Blackwell on


@functools.cache
def _load(path: str) -> tuple[GpuPeak, ...]:
    gpus = json.loads(Path(path).read_text())["gpus"]
    return tuple(GpuPeak(**{**g, "tflops": dict(g["tflops"]), "match": tuple(g["match"])})
                 for g in gpus)


def load_peaks(path: str | Path = PEAKS_FILE) -> dict[str, GpuPeak]:
    """Every GPU in the peaks file, by name (e.g. ``"H100 SXM"``)."""
    return {gpu.name: gpu for gpu in _load(str(path))}


def peak_for(device_name: str, path: str | Path = PEAKS_FILE) -> GpuPeak | None:
    """The entry for a ``torch.cuda.get_device_name()`` ("NVIDIA H100 80GB HBM3"), or None."""
    matching = (g for g in _load(str(path)) if any(re.search(p, device_name) for p in g.match))
    return next(matching, None)


def peak_tflops(device_name: str, dtype: str) -> float | None:
    """Dense datasheet peak of ``dtype`` (fp32...fp8, float32...) on a GPU; None where unknown."""
    key = str(dtype).removeprefix("torch.").lower()
    key = _ALIASES.get(key, key)
    if key not in FORMATS:
        raise ValueError(f"Unknown format {dtype!r}: use one of {', '.join(FORMATS)} "
                         "(or float32/float16/bfloat16).")
    gpu = peak_for(device_name)
    return gpu.tflops.get(key) if gpu else None


def fraction_of_peak(tflops: float | None, device_name: str, dtype: str) -> float | None:
    """Measured ``tflops`` as a fraction of :func:`peak_tflops` (None where either is unknown)."""
    peak = peak_tflops(device_name, dtype)
    return None if peak is None or tflops is None else tflops / peak


def ridge_flop_per_byte(device_name: str, dtype: str) -> float | None:
    """Datasheet ridge (peak FLOP/s over bandwidth; below it, memory-bound); None where unknown."""
    gpu, peak = peak_for(device_name), peak_tflops(device_name, dtype)
    return None if gpu is None or peak is None else peak / gpu.bandwidth_tb_s
