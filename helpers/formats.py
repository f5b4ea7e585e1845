"""Facts about floating-point formats, computed from ``torch.finfo`` (nothing typed in by hand)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

COURSE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INT_VIEW = {16: torch.int16, 32: torch.int32, 64: torch.int64}


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
    decimal_digits: int

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
        name=str(dtype).removeprefix("torch."),
        bits=info.bits,
        exponent_bits=info.bits - 1 - mantissa_bits,
        mantissa_bits=mantissa_bits,
        max=float(info.max),
        smallest_normal=float(info.smallest_normal),
        smallest_subnormal=float(info.smallest_normal) * float(info.eps),
        eps=float(info.eps),
        decimal_digits=round(-math.log10(info.resolution)),
    )


def bit_fields(value: float, dtype: torch.dtype) -> tuple[str, str, str]:
    """The sign, exponent and mantissa bits of ``value`` stored as ``dtype``, as strings of 0 and 1."""
    facts = format_facts(dtype)
    raw = torch.tensor([value], dtype=dtype).view(_INT_VIEW[facts.bits]).item()
    bits = format(raw & ((1 << facts.bits) - 1), f"0{facts.bits}b")
    return bits[0], bits[1 : 1 + facts.exponent_bits], bits[1 + facts.exponent_bits :]


def round_trip(values: torch.Tensor | float, dtype: torch.dtype) -> torch.Tensor:
    """Store ``values`` as ``dtype`` and read them back as float64 (what the format actually keeps)."""
    return torch.as_tensor(values, dtype=torch.float64).to(dtype).to(torch.float64)


def spacing(values: torch.Tensor | float, dtype: torch.dtype) -> torch.Tensor:
    """Gap from each value (rounded to ``dtype``) to the next representable ``dtype`` number, as float64.

    Infinity where the value overflows ``dtype``.
    """
    stored = torch.as_tensor(values, dtype=torch.float64).abs().to(dtype)
    following = torch.nextafter(stored, torch.full_like(stored, float("inf")))
    gap = following.to(torch.float64) - stored.to(torch.float64)
    return torch.where(stored.isinf(), torch.full_like(gap, float("inf")), gap)
