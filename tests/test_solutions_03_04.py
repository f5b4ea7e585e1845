"""The exercise solutions of notebooks 03 and 04 give the known answers, and check() tells right from wrong."""
import torch

import helpers
from helpers.exercises import solution


def test_03_1_smallest_update_that_changes_two_in_float16():
    expected = helpers.spacing(2.0, torch.float16).item()  # the gap after 2.0; half of it is a tie (rounds to even)
    assert expected == 2.0**-9
    assert solution("03.1") == expected
    assert helpers.check("03.1", 2.0**-9) is True
    assert helpers.check("03.1", 2.0**-10) is False
    assert helpers.check("03.1", 0.00195) is True   # rounded as printed: accepted (TOLERANCES)
    assert helpers.check("03.1", 2.0**-8) is False


def test_03_2_cdist_runs_in_float32_under_cpu_autocast():
    assert solution("03.2") == torch.float32
    assert helpers.check("03.2", torch.float32) is True
    assert helpers.check("03.2", torch.bfloat16) is False


def test_03_3_counts_the_casts_of_the_backward_pass():
    # The forward casts the input, 4 convolution weights, the linear weight and bias to bfloat16, and the logits
    # back to float32. Each cast whose source needs a gradient is mirrored in backward: 4 + 2 weight gradients
    # back to float32, and the loss gradient to bfloat16 for the logits; the input needs no gradient.
    assert solution("03.3") == 4 + 2 + 1
    assert helpers.check("03.3", 7) is True
    assert helpers.check("03.3", 8) is False   # the forward pass's count


def test_04_1_scale_after_a_sequence_of_steps():
    # 2^16: 3 clean -> 2^17; inf -> 2^16; 3 clean -> 2^17; clean; inf -> 2^16; inf -> 2^15; clean -> 2^15
    assert solution("04.1") == 2.0**15
    assert helpers.check("04.1", 32768) is True
    assert helpers.check("04.1", 65536) is False


def test_04_2_smallest_scale_that_keeps_1e9():
    assert solution("04.2") == 32.0
    assert (torch.tensor(1e-9) * 32).half().item() > 0
    assert (torch.tensor(1e-9) * 16).half().item() == 0
    assert helpers.check("04.2", 32) is True
    assert helpers.check("04.2", 5) is False  # the exponent, not the scale


def test_04_3_one_bad_micro_batch_skips_its_whole_accumulated_step():
    assert solution("04.3") == 2
    assert helpers.check("04.3", 2) is True
    assert helpers.check("04.3", 3) is False
