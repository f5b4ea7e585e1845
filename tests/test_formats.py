"""helpers.formats: facts, bit fields, spacing and mantissa rounding of every course format."""
import math

import pytest
import torch

from helpers import bit_fields, format_facts, round_trip, spacing
from helpers.formats import FP8_DTYPES, round_mantissa


def test_float16_facts_match_ieee_half_precision():
    f = format_facts(torch.float16)
    assert (f.bits, f.exponent_bits, f.mantissa_bits) == (16, 5, 10)
    assert f.max == 65504.0
    assert f.smallest_normal == 2.0**-14
    assert f.smallest_subnormal == 2.0**-24
    assert f.eps == 2.0**-10
    assert f.max_exact_integer == 2048


def test_bfloat16_has_float32_range_and_8_bits_of_precision():
    bf16, fp32 = format_facts(torch.bfloat16), format_facts(torch.float32)
    assert bf16.exponent_bits == fp32.exponent_bits == 8
    assert bf16.mantissa_bits == 7 and fp32.mantissa_bits == 23
    assert bf16.smallest_normal == fp32.smallest_normal
    assert math.isclose(bf16.max, fp32.max, rel_tol=0.01)
    assert bf16.max_exact_integer == 256


def test_integer_dtypes_are_refused():
    with pytest.raises(TypeError):
        format_facts(torch.int32)


@pytest.mark.parametrize(
    "value, dtype, fields",
    [
        (1.0, torch.float16, ("0", "01111", "0000000000")),
        (-2.5, torch.bfloat16, ("1", "10000000", "0100000")),
        (65504.0, torch.float16, ("0", "11110", "1111111111")),
        (float("inf"), torch.float16, ("0", "11111", "0000000000")),
    ],
)
def test_bit_fields(value, dtype, fields):
    assert bit_fields(value, dtype) == fields


def test_round_trip_shows_what_is_stored():
    assert round_trip(0.1, torch.float16).item() == 0.0999755859375
    assert round_trip(70000.0, torch.float16).item() == math.inf
    assert round_trip(1e-8, torch.float16).item() == 0.0


def test_spacing_grows_with_magnitude_and_is_inf_past_the_range():
    gaps = spacing(torch.tensor([1.0, 1024.0, 1e5]), torch.float16)
    assert gaps[0].item() == 2.0**-10
    assert gaps[1].item() == 1.0
    assert gaps[2].item() == math.inf
    assert spacing(0.0, torch.float16).item() == 2.0**-24


# --- 8-bit formats (torch >= 2.1, on CPU too) ---


def test_fp8_facts_match_the_fp8_paper():
    e4m3, e5m2 = (format_facts(d) for d in FP8_DTYPES)
    assert (e4m3.bits, e4m3.exponent_bits, e4m3.mantissa_bits, e4m3.max) == (8, 4, 3, 448.0)
    assert (e5m2.bits, e5m2.exponent_bits, e5m2.mantissa_bits, e5m2.max) == (8, 5, 2, 57344.0)
    assert e4m3.smallest_subnormal == 2.0**-9 and e5m2.smallest_subnormal == 2.0**-16
    assert e5m2.smallest_normal == format_facts(torch.float16).smallest_normal  # float16's exponent


@pytest.mark.parametrize(
    "value, dtype, fields",
    [
        (448.0, torch.float8_e4m3fn, ("0", "1111", "110")),
        (1.0, torch.float8_e4m3fn, ("0", "0111", "000")),
        (-0.5, torch.float8_e5m2, ("1", "01110", "00")),
        (float("inf"), torch.float8_e5m2, ("0", "11111", "00")),
    ],
)
def test_bit_fields_of_fp8(value, dtype, fields):
    assert bit_fields(value, dtype) == fields


def test_e4m3fn_has_no_infinity():
    patterns = torch.tensor([0x7E, 0x7F], dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    assert patterns[0].item() == 448.0 and patterns[1].isnan()
    converted = torch.tensor([500.0, math.inf]).to(torch.float8_e4m3fn).float()
    assert not converted.isinf().any()  # NaN (torch 2.4) or 448 (saturating, newer releases): never inf


def test_spacing_of_every_format_including_fp8():
    assert spacing(1.0, torch.float8_e4m3fn).item() == 0.125
    assert spacing(1.0, torch.float8_e5m2).item() == 0.25
    assert spacing(0.0, torch.float8_e4m3fn).item() == 2.0**-9
    for dtype in (torch.float16, torch.float8_e4m3fn, torch.float8_e5m2):
        top = torch.finfo(dtype).max
        assert spacing(top, dtype).item() == math.inf and spacing(2 * top, dtype).item() == math.inf
    values = torch.tensor([1e-3, 0.3, 7.0, 1e4])
    nextafter = torch.nextafter(values.half(), torch.tensor(math.inf).half()).double() - values.half().double()
    assert torch.equal(spacing(values, torch.float16), nextafter)


# --- round_mantissa: TF32 emulation ---

def test_round_mantissa_matches_the_16_bit_casts():
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    assert torch.equal(round_mantissa(x, 7), x.bfloat16().float())  # bf16: float32's exponent, 7 bits
    normal = x.abs() >= torch.finfo(torch.float16).smallest_normal
    assert torch.equal(round_mantissa(x, 10)[normal], x.half().float()[normal])  # same 10 bits as fp16
    assert torch.equal(round_mantissa(x, 23), x)


def test_round_mantissa_ties_to_even_and_truncation():
    ulp = 2.0**-10  # the gap after 1.0 with 10 mantissa bits
    x = torch.tensor([1 + ulp / 2, 1 + 3 * ulp / 2, 1 + ulp / 2 + 2.0**-20, -(1 + ulp / 2)])
    assert round_mantissa(x, 10).tolist() == [1.0, 1 + 2 * ulp, 1 + ulp, -1.0]
    assert round_mantissa(x, 10, truncate=True).tolist() == [1.0, 1 + ulp, 1.0, -1.0]
    special = torch.tensor([math.inf, -math.inf, math.nan, torch.finfo(torch.float32).max])
    out = round_mantissa(special, 10)
    assert out[0] == math.inf and out[1] == -math.inf and out[2].isnan() and out[3] == math.inf  # max rounds up


def test_round_mantissa_refuses_other_dtypes_and_bits():
    with pytest.raises(TypeError):
        round_mantissa(torch.ones(2, dtype=torch.float64), 10)
    with pytest.raises(ValueError):
        round_mantissa(torch.ones(2), 24)
