"""Notebook 02's exercise solutions give the right answers, and grade() rejects wrong ones (moved unchanged from
tests/test_solutions_01_02.py)."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import helpers
from helpers.exercises import feedback, grade, solution, tolerance


def test_02_1_bfloat16_and_float16_promote_to_float32():
    assert torch.promote_types(torch.bfloat16, torch.float16) == torch.float32
    assert torch.finfo(torch.bfloat16).max > torch.finfo(torch.float16).max  # bf16 has the range,
    assert torch.finfo(torch.bfloat16).eps > torch.finfo(torch.float16).eps  # fp16 the precision
    assert solution("02.1") == torch.float32
    assert grade("02.1", torch.float32) is True
    assert grade("02.1", torch.bfloat16) is False and grade("02.1", torch.float16) is False
    assert grade("02.1", "float32") is False  # the notebook asks for a torch.dtype object, not a string


def test_02_2_smallest_value_that_overflows_fp16():
    fp16_max = torch.finfo(torch.float16).max
    spacing_at_max = 2.0 ** (math.floor(math.log2(fp16_max)) - 10)  # 10 stored mantissa bits
    expected = fp16_max + spacing_at_max / 2
    assert solution("02.2") == expected == 65520.0
    assert torch.tensor(expected).half().isinf()
    below = torch.nextafter(torch.tensor(expected), torch.tensor(0.0))
    assert not below.half().isinf()
    assert grade("02.2", 65520.0) is True and grade("02.2", fp16_max) is False
    # a value just below the threshold is within the default tolerance but converts to a finite 65504: wrong
    just_below = torch.tensor(65519.996, dtype=torch.float32)
    assert just_below.item() < expected and just_below.half().item() == fp16_max
    assert tolerance("02.2") == 0.0
    assert grade("02.2", just_below.item()) is False and grade("02.2", 65519.996) is False


def test_02_3_wrong_positions_in_fp16_arange():
    odd_numbers_above_2048 = len(range(2049, 4096, 2))  # float16 steps by 2 between 2048 and 4096
    assert solution("02.3") == odd_numbers_above_2048 == 1024
    assert grade("02.3", 1024) is True and grade("02.3", 2048) is False


def given_class(name: str) -> type:
    """The class ``name`` exactly as notebook 02's exercise cell defines it (the learner's start)."""
    from tests.support import definitions

    return definitions("02", name, namespace={"torch": torch, "nn": nn})[name]


def pool_variant(weights_of):
    """An AttentionPool whose forward computes ``weights_of(self, scores, pad, features)`` and pools."""
    from helpers.solutions.nb02 import AttentionPool

    class Variant(AttentionPool):
        def forward(self, features, pad):
            weights = weights_of(self, self.score(features).squeeze(-1), pad, features)
            return (weights.unsqueeze(-1) * features).sum(dim=1)
    return Variant


def _softmax(scores):
    return torch.softmax(scores, dim=-1)


def _min(scores):
    return torch.finfo(scores.dtype).min


WRONG_02_4 = {  # name: (repair, the first failed condition check names)
    "-inf buffer, masked_fill": (lambda m, s, pad, f: _softmax(s.masked_fill(pad, m.big_negative)),
                                 "a score became -inf"),
    "float('-inf') fill": (lambda m, s, pad, f: _softmax(s.masked_fill(pad, float("-inf"))),
                           "a score became -inf"),
    "float('-inf') fill, then zero weights": (
        lambda m, s, pad, f: _softmax(s.masked_fill(pad, float("-inf"))).masked_fill(pad, 0),
        "never -inf"),
    "-inf from torch.full, then zero weights": (
        lambda m, s, pad, f: _softmax(torch.where(pad, torch.full_like(s, float("-inf")), s)).masked_fill(pad, 0),
        "never -inf"),
    "finfo.min added (overflows to -inf)": (lambda m, s, pad, f: _softmax(s + pad.to(s.dtype) * _min(s)),
                                            "an added finfo.min that overflowed"),
    "clamp of the -inf buffer": (lambda m, s, pad, f: _softmax(s + pad * m.big_negative.clamp(min=_min(s))),
                                 "a score became -inf"),
    "finfo.min fill, empty row left uniform": (lambda m, s, pad, f: _softmax(s.masked_fill(pad, _min(s))),
                                               "a fully padded row still averages its padding"),
    "nan_to_num around the broken line": (lambda m, s, pad, f: torch.nan_to_num(_softmax(s + pad * m.big_negative)),
                                          "nan_to_num hides the NaN"),
    "nan_to_num after a -inf fill": (lambda m, s, pad, f: torch.nan_to_num(_softmax(s.masked_fill(pad, float("-inf")))),
                                     "nan_to_num hides the NaN"),
    "mask line deleted": (lambda m, s, pad, f: _softmax(s), "the padding is not ignored"),
    "negated scores": (lambda m, s, pad, f: _softmax((-s).masked_fill(pad, _min(s))).masked_fill(pad, 0),
                       "not the softmax-weighted mean"),
    "5x scores": (lambda m, s, pad, f: _softmax((5 * s).masked_fill(pad, _min(s))).masked_fill(pad, 0),
                  "not the softmax-weighted mean"),
    "float32 -1e9 (a leak)": (lambda m, s, pad, f: _softmax(s.float() + pad * -1e9),
                              "mixes into the float16 computation"),
    "pad * -1e9 as a Python number, zero weights": (
        lambda m, s, pad, f: _softmax(s + pad * -1e9).masked_fill(pad, 0), "mixes into the float16"),
    "float16 hard-coded": (lambda m, s, pad, f: _softmax(s.half().masked_fill(pad, -65504.0)).masked_fill(pad, 0),
                           "in float32, "),  # its float16 rounding shows
    "zero weights after a NaN (multiplied)": (lambda m, s, pad, f: _softmax(s + pad * m.big_negative) * ~pad,
                                              "rows with real tokens still give NaN"),
}


def test_02_4_the_given_class_gives_nan_and_is_rejected():
    broken = given_class("AttentionPool")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        pool = broken().half()
    features = torch.rand(2, 5, 8, generator=torch.Generator().manual_seed(2)).half()
    padding = torch.tensor([[False] * 5, [False, False, False, True, True]])
    with torch.inference_mode():
        output = pool(features, padding)
    assert output.dtype == torch.float16 and output.isnan().all()  # 0 * fp16(-1e9) = 0 * -inf = NaN
    assert feedback("02.4", broken) == "rows with real tokens still give NaN or inf"


@pytest.mark.parametrize("name", WRONG_02_4)
def test_02_4_wrong_repairs_fail_with_the_condition_they_break(name):
    repair, reason = WRONG_02_4[name]
    assert reason in feedback("02.4", pool_variant(repair))


def test_02_4_a_float32_computation_cast_back_to_float16_still_fails_on_the_empty_row():
    from helpers.solutions.nb02 import AttentionPool

    class CastTheResult(AttentionPool):  # the -1e9 mask kept in float32, the result cast to the module's dtype
        def forward(self, features, pad):
            weights = torch.softmax(self.score(features).squeeze(-1).float() + pad * -1e9, dim=-1)
            return (weights.unsqueeze(-1) * features.float()).sum(dim=1).to(features.dtype)

    assert feedback("02.4", CastTheResult) == ("a fully padded row still averages its padding (section 5: give a "
                                               "row with no token zero weights)")


def _python_number_mask(cast_result):
    from helpers.solutions.nb02 import AttentionPool

    class PythonNumberMask(AttentionPool):  # the given line with the buffer replaced by the Python number -1e9
        def forward(self, features, pad):
            scores = self.score(features).squeeze(-1) + pad * -1e9  # float32: a bool mask times a Python float
            weights = torch.softmax(scores, dim=-1).masked_fill(pad, 0)
            pooled = (weights.unsqueeze(-1) * features).sum(dim=1)
            return pooled.to(features.dtype) if cast_result else pooled
    return PythonNumberMask


@pytest.mark.parametrize("cast_result", [False, True], ids=["uncast", "result cast back"])
def test_02_4_a_python_number_mask_is_a_leak_and_a_cast_of_the_result_does_not_fix_it(cast_result):
    reason = feedback("02.4", _python_number_mask(cast_result))
    assert reason is not None and "mixes into the float16 computation" in reason, reason
    assert "hides the leak" in reason and "returns float32" not in reason  # the cast is not offered as the fix


def test_02_4_answers_that_are_not_a_class_are_told_so():
    from helpers.solutions.nb02 import AttentionPool, pool_inputs

    features, pad = pool_inputs()
    with torch.inference_mode():
        number = AttentionPool()(features, pad).mean()
    for answer in (number, number.item(), AttentionPool(), "AttentionPool"):
        assert feedback("02.4", answer) == "the answer should be your repaired AttentionPool class itself"


def test_02_4_right_repairs_written_differently_pass():
    from helpers.solutions.nb02 import AttentionPool

    class FloatIsland(AttentionPool):  # the softmax in float32, its weights cast back (the cause, not the result)
        def forward(self, features, pad):
            scores = self.score(features).squeeze(-1).float().masked_fill(pad, torch.finfo(torch.float32).min)
            weights = torch.softmax(scores, dim=-1).masked_fill(pad, 0).to(features.dtype)
            return (weights.unsqueeze(-1) * features).sum(dim=1)

    right = [AttentionPool, FloatIsland,
             pool_variant(lambda m, s, pad, f: torch.where(pad.all(-1, keepdim=True), 0.0,
                                                           _softmax(s.masked_fill(pad, _min(s)))).to(s.dtype))]
    for pool in right:
        assert feedback("02.4", pool) is None, pool


def test_02_4_check_leaves_the_global_generator_alone():
    from helpers.solutions.nb02 import AttentionPool

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    assert grade("02.4", AttentionPool) is True
    assert torch.equal(torch.rand(3), expected)


def test_02_3_accepts_the_hints_zero_dim_tensor():
    table = torch.arange(4096, dtype=torch.float16)
    count = (table.long() != torch.arange(4096)).sum()
    assert count.dim() == 0 and feedback("02.3", count) is None and grade("02.3", count.item()) is True


@pytest.mark.parametrize("key", ["02.1", "02.2", "02.3", "02.4"])
def test_unanswered(key, capsys):
    assert helpers.check(key, None) is None
    assert "not answered yet" in capsys.readouterr().out
