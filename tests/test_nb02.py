"""Notebook 02's exercise solutions give the right answers, and grade() rejects wrong ones (moved unchanged from
tests/test_solutions_01_02.py)."""
from __future__ import annotations

import math

import pytest
import torch

import helpers
from torch import nn

from helpers.exercises import grade, solution, tolerance


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


def _exercise_02_4(pool_class) -> torch.Tensor:
    """The check cell of exercise 02.4, with ``pool_class`` in place of the notebook's AttentionPool."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        pool = pool_class().half()
    features = torch.rand(2, 5, 8, generator=torch.Generator().manual_seed(2)).half()
    padding = torch.tensor([[False] * 5, [False, False, False, True, True]])
    with torch.inference_mode():
        return pool(features, padding)


def test_02_4_the_wrong_repairs_are_rejected_and_the_fix_accepted():
    import json
    from pathlib import Path

    from helpers.solutions.nb02 import AttentionPool

    cells = json.loads((Path(__file__).resolve().parent.parent / "notebooks" /
                        "02_dtype_following_tensors.ipynb").read_text())["cells"]
    given = ["".join(c["source"]) for c in cells if "class AttentionPool" in "".join(c["source"])]
    assert len(given) == 1
    namespace = {"torch": torch, "nn": nn}
    exec(given[0], namespace)  # the broken code, as the learner receives it
    broken = namespace["AttentionPool"]
    output = _exercise_02_4(broken)
    assert output.dtype == torch.float16 and output.isnan().all()  # 0 * fp16(-1e9) = 0 * -inf = NaN
    assert grade("02.4", broken) is False

    def variant(scores_of):  # an AttentionPool whose masked scores are scores_of(raw scores, pad, fill)
        class Variant(AttentionPool):
            def forward(self, features, pad):
                scores = scores_of(self.score(features).squeeze(-1), pad, self.big_negative)
                return (torch.softmax(scores, dim=-1).unsqueeze(-1) * features).sum(dim=1)
        return Variant

    class FloatIsland(AttentionPool):  # another correct repair: the softmax in float32, the result float16
        def forward(self, features, pad):
            scores = self.score(features).squeeze(-1).float().masked_fill(pad, torch.finfo(torch.float32).min)
            weights = torch.softmax(scores, dim=-1).to(features.dtype)
            return (weights.unsqueeze(-1) * features).sum(dim=1)

    fill = lambda s, pad: s.masked_fill(pad, torch.finfo(s.dtype).min)  # noqa: E731
    wrong = {"nan_to_num around the broken line": variant(lambda s, pad, big: torch.nan_to_num(s + pad * big)),
             "negated scores": variant(lambda s, pad, big: fill(-s, pad)),
             "5x scores": variant(lambda s, pad, big: fill(5 * s, pad)),
             "mask dropped": variant(lambda s, pad, big: s),
             "float32 -1e9 added": variant(lambda s, pad, big: s.float() + pad * -1e9)}
    for name, pool in wrong.items():
        assert grade("02.4", pool) is False, name
    assert grade("02.4", _exercise_02_4(AttentionPool).float().mean().item()) is False  # a number: no class
    assert grade("02.4", AttentionPool) is True and grade("02.4", FloatIsland) is True


@pytest.mark.parametrize("key", ["02.1", "02.2", "02.3", "02.4"])
def test_unanswered(key, capsys):
    assert helpers.check(key, None) is None
    assert "not answered yet" in capsys.readouterr().out
