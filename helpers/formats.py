"""Facts about floating-point formats, computed from ``torch.finfo``; notebook 00 §3-4."""

import math
from dataclasses import dataclass

import torch

COURSE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# 8-bit floats (torch >= 2.1, on CPU too): storage here; fp8 matmuls run on Ada/Hopper tensor cores
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
ALL_FORMATS = COURSE_DTYPES + FP8_DTYPES
_INT_VIEW = {8: torch.int8, 16: torch.int16, 32: torch.int32, 64: torch.int64}


@dataclass(frozen=True)
class FormatFacts:
    """The layout and limits of one floating-point dtype."""

    name: str
    bits: int
    exponent_bits: int
    mantissa_bits: int  # stored fraction bits (the leading 1 of a normal number is implicit)
    max: float
    smallest_normal: float
    smallest_subnormal: float
    eps: float  # spacing between 1.0 and the next representable number

    @property
    def max_exact_integer(self) -> int:
        """Every integer up to this one is exactly representable (2 ** (mantissa_bits + 1))."""
        return 2 ** (self.mantissa_bits + 1)


def format_facts(dtype: torch.dtype) -> FormatFacts:
    """Compute the facts of a floating-point ``dtype`` from ``torch.finfo``."""
    if not dtype.is_floating_point:
        raise TypeError(f"{dtype} is not a floating-point dtype")
    info = torch.finfo(dtype)
    mantissa_bits = -int(math.log2(info.eps))
    return FormatFacts(
        name=str(dtype).removeprefix("torch."), bits=info.bits,
        exponent_bits=info.bits - 1 - mantissa_bits, mantissa_bits=mantissa_bits,
        max=float(info.max), smallest_normal=float(info.smallest_normal),
        smallest_subnormal=float(info.smallest_normal) * float(info.eps), eps=float(info.eps))


def bit_fields(value: float, dtype: torch.dtype) -> tuple[str, str, str]:
    """The sign, exponent and mantissa bits of ``value`` stored as ``dtype``, as "0"/"1" strings."""
    facts = format_facts(dtype)
    raw = torch.tensor([value], dtype=torch.float64).to(dtype).view(_INT_VIEW[facts.bits]).item()
    bits = format(raw & ((1 << facts.bits) - 1), f"0{facts.bits}b")
    return bits[0], bits[1 : 1 + facts.exponent_bits], bits[1 + facts.exponent_bits :]


def round_trip(values: torch.Tensor | float, dtype: torch.dtype) -> torch.Tensor:
    """``values`` stored as ``dtype``, read back as float64: what the format actually keeps."""
    return torch.as_tensor(values, dtype=torch.float64).to(dtype).to(torch.float64)


def spacing(values: torch.Tensor | float, dtype: torch.dtype) -> torch.Tensor:
    """Gap from each value (rounded to ``dtype``) to the next ``dtype`` number, fp8 too; 00 §4."""
    magnitude = torch.as_tensor(values, dtype=torch.float64).abs()
    stored = magnitude.to(dtype)
    following = (stored.view(_INT_VIEW[format_facts(dtype).bits]) + 1).view(dtype).to(torch.float64)
    gap = following - stored.to(torch.float64)
    return torch.where(gap.isfinite() & (magnitude <= torch.finfo(dtype).max), gap, math.inf)


def round_mantissa(x: torch.Tensor, bits: int, *, truncate: bool = False) -> torch.Tensor:
    """Float32 ``x`` rounded (or truncated) to ``bits`` mantissa bits: 10 is TF32, 7 bf16. 00 §9."""
    if x.dtype != torch.float32:
        raise TypeError(f"round_mantissa expects float32, got {x.dtype}")
    if not 0 <= bits <= 23:
        raise ValueError(f"bits must be between 0 and 23 (float32 stores 23), got {bits}")
    drop = 23 - bits
    if drop == 0:
        return x.clone()
    raw = x.view(torch.int32)
    if not truncate:  # just under half a unit of the last kept bit, +1 if it is odd: ties to even
        raw = raw + ((1 << (drop - 1)) - 1) + ((raw >> drop) & 1)
    rounded = (raw & ~((1 << drop) - 1)).view(torch.float32)
    return torch.where(x.isfinite(), rounded, x)
