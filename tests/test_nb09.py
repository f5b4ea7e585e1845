"""Notebook 09's scaffolding (helpers.nb09) and its exercises' judge and count."""
import math

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader

import helpers
from helpers import nb09 as lab
from helpers.exercises import feedback, solution
from helpers.solutions import nb09 as solutions
from tests.support import cell_containing, definitions

BF16 = torch.bfloat16


def test_mlp_and_batches_are_seeded():
    assert torch.equal(lab.mlp(8)[0].weight, lab.mlp(8)[0].weight)
    assert len([m for m in lab.mlp(8, depth=4) if isinstance(m, torch.nn.Linear)]) == 4
    assert all(torch.equal(a, b) for a, b in zip(lab.batch(4, 8), lab.batch(4, 8)))


def test_a_step_trains_its_float32_weights():
    model = lab.mlp(16)
    before = model[0].weight.detach().clone()
    loss = lab.Step(model, BF16, lab.batch(8, 16))()
    assert loss.dtype == torch.float32 and model[0].weight.dtype == torch.float32
    assert not torch.equal(before, model[0].weight)


def cell_profile_step():
    """09's own profile_step, with the CATEGORIES its cell defines."""
    import ast

    from torch.profiler import ProfilerActivity, profile, record_function
    cell = cell_containing("09", "def profile_step(")
    (categories,) = [node.value for node in ast.parse(cell).body
                     if isinstance(node, ast.Assign) and node.targets[0].id == "CATEGORIES"]
    namespace = {"torch": torch, "helpers": helpers, "ProfilerActivity": ProfilerActivity, "profile": profile,
                 "record_function": record_function, "CATEGORIES": ast.literal_eval(categories)}
    return definitions("09", "category", "profile_step", namespace=namespace)["profile_step"]


profile_step = cell_profile_step()


def test_profile_shares_count_the_casts_autocast_adds_and_the_optimizer():
    shares = {dtype: profile_step(lab.Step(lab.mlp(16), dtype, lab.batch(8, 16)))[1]
              for dtype in (None, BF16)}
    for by_category in shares.values():
        assert math.isclose(sum(share for _, share in by_category.values()), 1.0)
        assert by_category["optimizer"][0] == 1 and by_category["matmuls"][0] == 8
        assert by_category["syncs"][0] == 0 and by_category["data loading"][0] == 0
    assert shares[BF16]["casts"][0] - shares[None]["casts"][0] == 15  # 7 + .float(), 1 + 6 back
    assert "casts" in lab.shares_line(shares[BF16]) and "casts" not in lab.shares_line(
        {"casts": (0, 0.0), "other": (math.nan, 1.0)})


def test_profile_shares_see_a_dataloader_and_a_sync():
    loader = DataLoader(lab.SlowPairs(16, 8, delay=0.0), batch_size=4)
    _, fed = profile_step(lab.Step(lab.mlp(8), BF16, loader))
    assert fed["data loading"][0] >= 1
    _, logged = profile_step(lab.Step(lab.mlp(8), BF16, lab.batch(4, 8), sync=True))
    assert logged["syncs"][0] == 1


def test_slow_pairs_are_the_seeded_batch():
    data = lab.SlowPairs(6, 3, delay=0.0)
    x, y = lab.batch(6, 3)
    assert len(data) == 6 and torch.equal(data[2][0], x[2]) and torch.equal(data[5][1], y[5])


def test_casts_lists_the_result_of_each_cast():
    weight = torch.randn(4, 4, requires_grad=True)
    with torch.autocast("cpu", dtype=BF16):
        found = lab.casts(lambda: weight @ torch.randn(4, 4))
    assert found == [((4, 4), BF16), ((4, 4), BF16)]


def _buggy(cell, inputs):
    hidden = torch.zeros(inputs.shape[1], cell.out_features)
    for x in inputs:
        with torch.autocast("cpu", dtype=BF16):
            hidden = torch.tanh(cell(torch.cat([x, hidden], dim=-1)))
    return hidden


def _no_autocast(cell, inputs):
    hidden = torch.zeros(inputs.shape[1], cell.out_features)
    for x in inputs:
        hidden = torch.tanh(cell(torch.cat([x, hidden], dim=-1)))
    return hidden


def _bf16_weights(cell, inputs):
    cell.to(BF16)
    hidden = torch.zeros(inputs.shape[1], cell.out_features, dtype=BF16)
    for x in inputs.to(BF16):
        hidden = torch.tanh(cell(torch.cat([x, hidden], dim=-1)))
    return hidden


def _no_cache(cell, inputs):
    with torch.autocast("cpu", dtype=BF16, cache_enabled=False):
        return _no_autocast(cell, inputs)


def _no_grad(cell, inputs):
    with torch.no_grad():
        return solutions.unroll_once(cell, inputs)


def _first_step_only(cell, inputs):
    return solutions.unroll_once(cell, inputs[:1])


def _skips_half(cell, inputs):
    return solutions.unroll_once(cell, inputs[len(inputs) // 2:])  # the last half: the same output, nearly


def _weight_cast_under_no_grad(cell, inputs):
    with torch.no_grad():
        weight = cell.weight.to(BF16)  # cast once, but no gradient can reach the weight
    hidden = torch.zeros(inputs.shape[1], cell.out_features)
    with torch.autocast("cpu", dtype=BF16):
        for x in inputs:
            hidden = torch.tanh(F.linear(torch.cat([x, hidden], dim=-1), weight, cell.bias))
    return hidden


def _detached_hidden(cell, inputs):
    hidden = torch.zeros(inputs.shape[1], cell.out_features)
    with torch.autocast("cpu", dtype=BF16):
        for x in inputs:
            hidden = torch.tanh(cell(torch.cat([x, hidden.detach()], dim=-1)))
    return hidden


def _raises(cell, inputs):
    raise RuntimeError("not repaired")


def _one_manual_cast(cell, inputs):
    weight, bias = cell.weight.to(BF16), cell.bias.to(BF16)
    hidden = torch.zeros(inputs.shape[1], cell.out_features, dtype=BF16)
    for x in inputs:
        hidden = torch.tanh(F.linear(torch.cat([x.to(BF16), hidden], dim=-1), weight, bias))
    return hidden


@pytest.mark.parametrize("wrong, reason", [
    (_buggy, "cast 8 times"), (_no_autocast, "no longer run in bfloat16"),
    (_bf16_weights, "no longer float32"), (_no_cache, "cast 8 times"),
    (_no_grad, "gradients"), (_first_step_only, "differs"), (_raises, "raised RuntimeError"),
    (_skips_half, "get no gradient"), (_weight_cast_under_no_grad, "no gradient reaches the cell's weight"),
    (_detached_hidden, "get no gradient"),
    ("unroll", "the repaired function"),
])
def test_the_judge_refuses_wrong_and_symptom_hiding_repairs(wrong, reason):
    message = feedback("09.1", wrong)
    assert message is not None and reason in message


@pytest.mark.parametrize("right", [solutions.unroll_once, _one_manual_cast])
def test_the_judge_accepts_a_single_cast(right):
    assert feedback("09.1", right) is None


@pytest.mark.parametrize("key, answer", [("09.1", solutions.unroll_once), ("09.1", _buggy), ("09.2", 23)])
def test_the_checks_leave_the_learners_random_state_alone(key, answer):
    torch.manual_seed(123)
    state = torch.get_rng_state()
    feedback(key, answer)
    assert torch.equal(torch.get_rng_state(), state)


def test_exercise_09_2_counts_five_layers():
    assert solution("09.2") == 23  # 11 forward (input, 5 weights, 5 biases) + .float() + 11 back
    assert feedback("09.2", 23) is None and feedback("09.2", 15) is not None


def test_a_convolution_counts_with_the_matmuls():
    x, w = torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3)
    _, shares = profile_step(lambda: F.conv2d(x, w), steps=2)
    assert shares["matmuls"][0] == 1 and shares["casts"][0] == 0


def test_a_float16_step_scales_its_loss_and_keeps_float32_weights():
    step = lab.Step(lab.mlp(8), torch.float16, lab.batch(4, 8))
    step()
    assert step.scaler.is_enabled() and step.scaler.get_scale() > 1
    assert all(p.dtype == torch.float32 for p in step.model.parameters())
    assert not lab.Step(lab.mlp(8), BF16, lab.batch(4, 8)).scaler.is_enabled()


def test_a_step_reads_its_data_again_after_each_pass():
    batches = [lab.batch(4, 8, seed=s) for s in range(2)]
    step = lab.Step(lab.mlp(8), None, batches)
    seen = [next(step.batches)[0] for _ in range(5)]
    assert [torch.equal(x, batches[i % 2][0]) for i, x in enumerate(seen)] == [True] * 5


def _shares(casts: float, matmuls: float, loading: float = 0.0) -> dict:
    return {"casts": (16.0, casts), "matmuls": (8.0, matmuls), "data loading": (1.0, loading)}


def _timing(f32_s: float, bf16_s: float, verdict: str):
    from helpers.timing import Comparison
    ratio = f32_s / bf16_s
    return Comparison(ratio, ratio * 0.9, ratio * 1.1, verdict, f32_s, bf16_s, 2)


def test_diagnose_gives_a_reason_only_where_the_shares_cover_the_difference():
    casts_cost = lab.shares_reason(_timing(0.010, 0.015, "slower"),  # 5 ms lost, casts add 3 of it
                                   {"float32": _shares(0.0, 0.2), "bfloat16": _shares(0.2, 0.1)})
    assert casts_cost.startswith("the casts autocast adds and the matmuls' change cover")
    assert "step 10.00 -> 15.00 ms" in casts_cost
    matmuls_saved = lab.shares_reason(_timing(0.010, 0.006, "faster"),  # matmuls 8 -> 3 ms
                                      {"float32": _shares(0.0, 0.8), "bfloat16": _shares(0.05, 0.5)})
    assert matmuls_saved.startswith("the matmuls' time fell")
    unexplained = lab.shares_reason(_timing(0.010, 0.006, "faster"),  # matmuls barely moved
                                    {"float32": _shares(0.0, 0.1), "bfloat16": _shares(0.05, 0.15)})
    assert unexplained.startswith("unexplained here (")
    starved = {"float32": _shares(0.0, 0.05, 0.8), "bfloat16": _shares(0.01, 0.05, 0.8)}
    loader = lab.shares_reason(_timing(0.010, 0.010, "no clear difference"), starved)
    assert loader.startswith("data loading takes 80% and 80% of the two steps")
    idle = {"float32": _shares(0.0, 0.1), "bfloat16": _shares(0.0, 0.1)}
    unclear = lab.shares_reason(_timing(0.010, 0.010, "no clear difference"), idle)
    assert unclear == "no reason given: no clear difference"
    assert not hasattr(lab, "rule_finding")
