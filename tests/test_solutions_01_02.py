"""The exercise solutions of notebooks 01 and 02 give the right answers, and check() rejects wrong ones."""
from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from helpers.data import shapes_dataset
from helpers.exercises import check, solution, tolerance
from helpers.measure import saved_activation_bytes_by_dtype
from helpers.model import load_reference_model


def test_01_1_saved_bytes_of_the_half_model():
    model = load_reference_model()  # float32 run: the floating saved tensors halve in float16, int64 indices do not
    batch = shapes_dataset("test", n=64).tensors[0]
    by_dtype = saved_activation_bytes_by_dtype(lambda: model(batch), exclude=model)
    assert set(by_dtype) == {torch.float32, torch.int64}
    expected = by_dtype[torch.float32] // 2 + by_dtype[torch.int64]
    assert solution("01.1") == expected == 12591808
    assert check("01.1", expected) is True
    assert check("01.1", sum(by_dtype.values())) is False  # the float32 figure
    assert check("01.1", sum(by_dtype.values()) // 2) is False  # halving everything, int64 indices included


def test_01_2_smallest_fp16_whose_square_overflows():
    # float16 numbers just below 256 are 1/8 apart; 255.875 ** 2 = 65472.015625 rounds to 65472 (finite),
    # 256 ** 2 = 65536 is past the rounding boundary of the largest float16.
    below = torch.tensor(255.875, dtype=torch.float16)
    assert torch.nextafter(below, torch.tensor(300.0, dtype=torch.float16)).item() == 256.0
    assert torch.isfinite(below * below) and (torch.tensor(256.0, dtype=torch.float16) ** 2).isinf()
    assert 255.875 ** 2 < torch.finfo(torch.float16).max + 16 < 256.0 ** 2
    assert solution("01.2") == 256.0
    assert check("01.2", 256.0) is True and check("01.2", 255.875) is False
    assert check("01.2", math.sqrt(torch.finfo(torch.float16).max)) is False  # 255.94: not a float16 number


def test_01_2_is_matched_exactly():
    assert tolerance("01.2") == 0.0
    assert check("01.2", 256.0001) is False  # within the default 1e-6, but not a float16 number


def test_01_3_bytes_of_the_parameter_copies_autocast_makes():
    model = load_reference_model()
    # CPU autocast runs conv2d and linear in bfloat16 and leaves batch_norm's float32 parameters alone
    cast = [p for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear)) for p in m.parameters()]
    expected = sum(p.numel() for p in cast) * torch.tensor([], dtype=torch.bfloat16).element_size()
    assert solution("01.3") == expected == 121712
    assert check("01.3", expected) is True
    all_parameters = sum(p.numel() for p in model.parameters()) * 2  # BatchNorm's weights included: wrong
    assert all_parameters != expected and check("01.3", all_parameters) is False
    assert check("01.3", expected + 3 * 32 * 32 * 2) is False  # with the cast of one input image: wrong
    assert check("01.3", "bfloat16") is False


def _serve_broken(requests, *, eval_mode=False, cast_inputs=False, safe_softmax=False):
    """Notebook 01's exercise 01.4 deployment code, with any of its three bugs repaired."""
    from helpers.model import CHECKPOINT, ShapesCNN

    model = ShapesCNN()
    model.load_state_dict(torch.load(CHECKPOINT, weights_only=True))
    if eval_mode:
        model.eval()
    model.half()
    probabilities = []
    with torch.inference_mode():
        for request in requests:
            logits = model(request.half() if cast_inputs else request)
            if safe_softmax:
                probabilities.append(torch.softmax(logits.float(), dim=1))
            else:
                e = logits.exp()
                probabilities.append(e / e.sum(dim=1, keepdim=True))
    return torch.cat(probabilities)


def test_01_4_repaired_deployment_code():
    from helpers.solutions.nb01 import REQUEST_SIZE, SERVED_IMAGES, true_class_probability

    images, labels = (t[:SERVED_IMAGES] for t in shapes_dataset("test").tensors)
    requests = list(images.split(REQUEST_SIZE))
    with pytest.raises(RuntimeError):  # as given: float32 input to a float16 model
        _serve_broken(requests)
    fixed = true_class_probability(_serve_broken(requests, eval_mode=True, cast_inputs=True, safe_softmax=True),
                                   labels)
    assert solution("01.4") == fixed and fixed > 0.95
    assert check("01.4", fixed) is True
    # each remaining bug alone gives an answer check() rejects
    no_eval = true_class_probability(_serve_broken(requests, cast_inputs=True, safe_softmax=True), labels)
    assert no_eval < 0.9 and check("01.4", no_eval) is False  # BatchNorm normalised each request by itself
    overflow = true_class_probability(_serve_broken(requests, eval_mode=True, cast_inputs=True), labels)
    assert math.isnan(overflow) and check("01.4", overflow) is False  # exp overflows: inf / inf
    # other correct repairs agree within the tolerance: float32, bfloat16, autocast
    model = load_reference_model()
    with torch.inference_mode():
        fp32 = torch.softmax(model(images), dim=1)
        bf16 = torch.softmax(copy.deepcopy(model).bfloat16()(images.bfloat16()).float(), dim=1)
        with torch.amp.autocast("cpu", dtype=torch.bfloat16):
            autocast = torch.softmax(model(images).float(), dim=1)
    for probabilities in (fp32, bf16, autocast):
        assert check("01.4", true_class_probability(probabilities, labels)) is True


def test_02_1_bfloat16_and_float16_promote_to_float32():
    assert torch.promote_types(torch.bfloat16, torch.float16) == torch.float32
    assert torch.finfo(torch.bfloat16).max > torch.finfo(torch.float16).max  # bf16 has the range,
    assert torch.finfo(torch.bfloat16).eps > torch.finfo(torch.float16).eps  # fp16 the precision
    assert solution("02.1") == torch.float32
    assert check("02.1", torch.float32) is True
    assert check("02.1", torch.bfloat16) is False and check("02.1", torch.float16) is False
    assert check("02.1", "float32") is False  # the notebook asks for a torch.dtype object, not a string


def test_02_2_smallest_value_that_overflows_fp16():
    fp16_max = torch.finfo(torch.float16).max
    spacing_at_max = 2.0 ** (math.floor(math.log2(fp16_max)) - 10)  # 10 stored mantissa bits
    expected = fp16_max + spacing_at_max / 2
    assert solution("02.2") == expected == 65520.0
    assert torch.tensor(expected).half().isinf()
    below = torch.nextafter(torch.tensor(expected), torch.tensor(0.0))
    assert not below.half().isinf()
    assert check("02.2", 65520.0) is True and check("02.2", fp16_max) is False
    # a value just below the threshold is within the default tolerance but converts to a finite 65504: wrong
    just_below = torch.tensor(65519.996, dtype=torch.float32)
    assert just_below.item() < expected and just_below.half().item() == fp16_max
    assert tolerance("02.2") == 0.0
    assert check("02.2", just_below.item()) is False and check("02.2", 65519.996) is False


def test_02_3_wrong_positions_in_fp16_arange():
    odd_numbers_above_2048 = len(range(2049, 4096, 2))  # float16 steps by 2 between 2048 and 4096
    assert solution("02.3") == odd_numbers_above_2048 == 1024
    assert check("02.3", 1024) is True and check("02.3", 2048) is False


def _exercise_02_4(pool_class) -> torch.Tensor:
    """The check cell of exercise 02.4, with ``pool_class`` in place of the notebook's AttentionPool."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        pool = pool_class().half()
    features = torch.rand(2, 5, 8, generator=torch.Generator().manual_seed(2)).half()
    padding = torch.tensor([[False] * 5, [False, False, False, True, True]])
    with torch.inference_mode():
        return pool(features, padding)


def test_02_4_broken_mask_is_rejected_and_repairs_accepted():
    import json
    from pathlib import Path

    from helpers.solutions.nb02 import AttentionPool

    cells = json.loads((Path(__file__).resolve().parent.parent / "notebooks" /
                        "02_dtype_following_tensors.ipynb").read_text())["cells"]
    given = ["".join(c["source"]) for c in cells if "class AttentionPool" in "".join(c["source"])]
    assert len(given) == 1
    namespace = {"torch": torch, "nn": nn}
    exec(given[0], namespace)  # the broken code, as the learner receives it
    broken = _exercise_02_4(namespace["AttentionPool"])
    assert broken.dtype == torch.float16 and broken.isnan().all()  # 0 * fp16(-1e9) = 0 * -inf = NaN
    assert check("02.4", broken.float().mean().item()) is False

    class FloatIsland(AttentionPool):  # another correct repair: the softmax in float32, the result float16
        def forward(self, features, pad):
            scores = self.score(features).squeeze(-1).float().masked_fill(pad, torch.finfo(torch.float32).min)
            weights = torch.softmax(scores, dim=-1).to(features.dtype)
            return (weights.unsqueeze(-1) * features).sum(dim=1)

    class Unmasked(AttentionPool):  # "repaired" by dropping the mask: the padding is averaged in
        def forward(self, features, pad):
            return (torch.softmax(self.score(features).squeeze(-1), -1).unsqueeze(-1) * features).sum(dim=1)

    repaired = _exercise_02_4(AttentionPool)
    assert repaired.dtype == torch.float16 and repaired.isfinite().all()
    assert check("02.4", repaired.float().mean().item()) is True
    assert check("02.4", _exercise_02_4(FloatIsland).float().mean().item()) is True
    assert check("02.4", _exercise_02_4(Unmasked).float().mean().item()) is False


@pytest.mark.parametrize("key", ["01.1", "01.2", "01.3", "01.4", "02.1", "02.2", "02.3", "02.4"])
def test_unanswered(key, capsys):
    assert check(key, None) is None
    assert "not answered yet" in capsys.readouterr().out


def test_unknown_exercise():
    with pytest.raises(KeyError, match="Unknown exercise"):
        solution("01.9")
