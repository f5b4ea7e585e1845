import math

import pytest
import torch

from helpers import bit_fields, format_facts, round_trip, spacing


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
