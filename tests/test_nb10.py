"""Notebook 10's scaffolding (helpers.nb10) and its exercise judges, fed the plausible wrong answers."""
import math

import pytest
import torch
from torch import nn

from helpers import nb10 as lab
from helpers.exercises import feedback, grade
from helpers.solutions import nb10 as solutions
from tests import support


def block_amax(x: torch.Tensor) -> torch.Tensor:
    return x.abs().unflatten(-1, (-1, 32)).amax(-1)


def test_the_spec_scales_are_accepted_with_or_without_a_trailing_one():
    assert grade("10.1", solutions.spec_e8m0_scales) is True
    assert feedback("10.1", lambda x: solutions.spec_e8m0_scales(x)[..., None]) is None


def test_the_spec_rule_puts_each_block_amax_in_256_to_512():
    x = solutions.exercise_10_1_inputs()
    ratio = block_amax(x) / solutions.spec_e8m0_scales(x)
    assert ratio.min() >= 256 and ratio.max() < 512


def test_a_scale_without_emax_is_rejected_naming_emax():
    answer = lambda x: torch.exp2(torch.floor(torch.log2(block_amax(x))))  # noqa: E731
    assert "largest exponent" in feedback("10.1", answer)


def test_rounding_the_scale_instead_of_flooring_is_rejected():
    rounded = lambda x: torch.exp2(torch.round(torch.log2(block_amax(x) / 448)))  # noqa: E731
    assert "rounds amax / 448" in feedback("10.1", rounded)


def test_a_cast_to_e8m0_is_named_as_rounding():
    if not hasattr(torch, "float8_e8m0fnu"):
        return
    cast = lambda x: (block_amax(x) / 448).to(torch.float8_e8m0fnu).float()  # noqa: E731
    assert "rounds amax / 448" in feedback("10.1", cast)


def test_other_wrong_mx_scales_get_their_own_feedback():
    ceil = lambda x: torch.exp2(torch.ceil(torch.log2(block_amax(x) / 448)))  # noqa: E731
    assert "RCEIL" in feedback("10.1", ceil)
    e5m2 = lambda x: torch.exp2(torch.floor(torch.log2(block_amax(x))) - 15)  # noqa: E731
    assert "e5m2" in feedback("10.1", e5m2)
    ratio = lambda x: block_amax(x) / 448  # noqa: E731
    assert "not a power of two" in feedback("10.1", ratio)
    down = lambda x: torch.exp2(torch.floor(torch.log2(x.abs().unflatten(0, (-1, 32)).amax(1))) - 8)  # noqa: E731
    assert "down the columns" in feedback("10.1", down)
    rowwise = lambda x: x.abs().amax(-1) / 448  # noqa: E731
    assert "shape" in feedback("10.1", rowwise)
    assert "function" in feedback("10.1", 3.0)


def test_the_notebooks_buggy_line_is_rejected():
    def e8m0_scales(x):  # the cell as shipped
        amax = x.abs().unflatten(-1, (-1, 32)).amax(-1)
        return torch.exp2(torch.round(torch.log2(amax / 448)))
    assert grade("10.1", e8m0_scales) is False


def test_grad_weight_scales_along_the_tokens_are_accepted():
    x = solutions.exercise_10_2_activation()
    for answer in (x.abs().amax(0) / 448, x.abs().amax(0, keepdim=True) / 448,
                   (x.abs().amax(0) / 448)[:, None]):
        assert grade("10.2", answer) is True


def test_grad_weight_scales_wrong_answers_are_named():
    x = solutions.exercise_10_2_activation()
    assert "per token" in feedback("10.2", x.abs().amax(1) / 448)  # the forward's axis
    assert "tensorwise" in feedback("10.2", x.abs().max() / 448)  # one scale
    assert "448" in feedback("10.2", x.abs().amax(0))  # no division
    assert "e5m2" in feedback("10.2", x.abs().amax(0) / 57344)
    assert "tensor" in feedback("10.2", "scales")
    assert grade("10.2", None) is None


def test_the_notebooks_activation_is_the_judges():
    x = torch.randn(256, 96, generator=torch.Generator().manual_seed(10)) * torch.linspace(0.1, 10, 96)
    assert torch.equal(x, solutions.exercise_10_2_activation())


def test_capture_returns_the_layers_input_weight_and_output_gradient():
    torch.manual_seed(0)
    model = lab.GPT(width=32, layers=1, heads=2, context=16)
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(1))
    tensors = lab.capture(model, model.blocks[0].down, ids[:, :-1], ids[:, 1:])
    assert tensors["weight"].shape == (32, 96)
    assert tensors["activation"].shape == (16, 96) and tensors["gradient"].shape == (16, 32)
    assert tensors["gradient"].abs().sum() > 0
    assert all(p.grad is None for p in model.parameters())  # the capture leaves no gradients
    assert not model.blocks[0].down._forward_hooks and not model.blocks[0].down._forward_pre_hooks


def test_convert_linears_swaps_only_what_passes_the_filter():
    torch.manual_seed(0)
    model = lab.GPT(width=32, layers=2, heads=2, context=16)

    class Marked(nn.Module):
        def __init__(self, linear):
            super().__init__()
            self.weight = linear.weight

        def forward(self, x):
            return x @ self.weight.T

    names = lab.convert_linears(model, Marked, lambda module, name: not name.endswith("proj"))
    assert names == [f"blocks.{i}.{n}" for i in range(2) for n in ("qkv", "up", "down")]
    assert isinstance(model.blocks[0].qkv, Marked) and isinstance(model.blocks[0].proj, nn.Linear)
    assert set(model.state_dict()) == set(lab.GPT(width=32, layers=2, heads=2, context=16).state_dict())


def test_final_hidden_is_what_the_head_multiplies():
    torch.manual_seed(0)
    model = lab.GPT(width=32, layers=2, heads=2, context=16).eval()
    ids = torch.randint(0, 256, (2, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits, _ = model(ids)
        assert torch.allclose(lab.final_hidden(model, ids) @ model.tokens.weight.T, logits, atol=1e-5)


def test_tables_and_plot():
    table = lab.error_table({"weight": {"none": 0.5, "mx": 0.01}, "gradient": {"none": 1.0, "mx": 0.02}})
    lines = table.splitlines()
    assert len(lines) == 3 and "none" in lines[0] and "0.0100" in lines[1] and "1.0000" in lines[2]
    rates = lab.rates_table()
    b200 = next(line for line in rates.splitlines() if line.startswith("B200"))
    assert "4,500" in b200 and "9,000" in b200
    t4 = next(line for line in rates.splitlines() if line.startswith("T4"))
    assert t4.split()[2:] == ["-"] * 4
    import matplotlib
    matplotlib.use("Agg")
    ax = lab.plot_losses({"a": [3.0, 2.0], "b": [3.0, 2.5]})
    assert len(ax.get_lines()) == 2


def test_capitals_splits_are_the_08_task():
    tune, check = lab.capitals_splits()
    assert len(tune) == 60_000 and len(check) > 1000
    assert lab.encode(lab.corpus_text(5, seed=1).upper()).tolist() == tune[: len(lab.encode(
        lab.corpus_text(5, seed=1).upper()))].tolist()


def test_convert_linears_skips_weights_that_are_not_multiples_of_16_by_default():
    model = nn.Sequential(nn.Linear(64, 48), nn.Linear(48, 30), nn.Linear(30, 32), nn.Linear(32, 16))
    names = lab.convert_linears(model, lambda linear: nn.Identity())
    assert names == ["0", "3"]
    assert [type(m).__name__ for m in model] == ["Identity", "Linear", "Linear", "Identity"]
    assert lab.divisible_by_16(nn.Linear(32, 16), "") and not lab.divisible_by_16(nn.Linear(15, 16), "")


def test_convert_linears_never_swaps_a_tied_head():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens, self.up, self.head = nn.Embedding(64, 32), nn.Linear(32, 32), nn.Linear(32, 64)
            self.head.weight = self.tokens.weight

    model = Tied()
    assert lab.tied_parameters(model) == {id(model.tokens.weight)}
    assert lab.convert_linears(model, lambda linear: nn.Identity(), lambda m, n: True) == ["up"]
    assert isinstance(model.head, nn.Linear)


def test_grad_weight_scales_in_half_precision_are_accepted_within_their_rounding():
    x = solutions.exercise_10_2_activation()
    for answer in ((x.abs().amax(0) / 448).bfloat16(), x.bfloat16().abs().amax(0) / 448,
                   x.half().abs().amax(0) / 448):
        assert grade("10.2", answer) is True
    rounded_then_widened = (x.bfloat16().abs().amax(0) / 448).float()  # bf16 rounding in a float32
    assert "rounded further" in feedback("10.2", rounded_then_widened)
    assert "float32" in feedback("10.2", (x.abs().amax(0) / 448).to(torch.float8_e4m3fn))
    assert "448" in feedback("10.2", x.bfloat16().abs().amax(0))  # no division, in bf16


def test_exercise_10_2_hint_leads_without_giving_the_answer():
    text = next(support.source(cell) for cell in support.cells(support.notebook("10"))
                if "**Exercise 10.2.**" in support.source(cell))
    hint = text.split("<summary>Hint</summary>")[1]
    assert "contract" in hint and "amax" in hint
    assert "amax(0)" not in hint.replace(" ", "") and "dim=0" not in hint


def cell_namespace() -> dict:
    """What the notebook's fp8 cells need: the definitions of section 2 and 3, FAST empty (the
    dequantising path, as on a machine without the scaled matmul)."""
    namespace = {"torch": torch, "nn": nn, "math": math, "F": torch.nn.functional,
                 "E4M3": torch.float8_e4m3fn, "FAST": {}}
    support.definitions("10", "mx_scale", "quantise", "dequantise", "pad_to", "fp8_matmul",
                        "Fp8Linear", "Float8Linear", namespace=namespace)
    namespace["GRAD_DTYPE"] = {"tensorwise": torch.float8_e5m2, "rowwise": torch.float8_e4m3fn,
                               "mx": torch.float8_e4m3fn}
    return namespace


def test_the_cells_quantise_refuses_inf_and_nan_before_its_clamp():
    quantise = cell_namespace()["quantise"]
    for bad in (math.inf, -math.inf, math.nan):
        x = torch.ones(4, 32)
        x[1, 3] = bad
        for scaling in ("none", "tensorwise", "rowwise", "mx"):
            with pytest.raises(FloatingPointError):
                quantise(x, torch.float8_e4m3fn, scaling)


def test_the_cells_fp8_matmul_pads_a_15_token_contraction_exactly():
    namespace = cell_namespace()
    generator = torch.Generator().manual_seed(3)
    a, b = torch.randn(32, 15, generator=generator), torch.randn(48, 15, generator=generator)
    assert namespace["pad_to"](a, 16).shape == (32, 16) and namespace["pad_to"](b, 16)[:, 15].eq(0).all()
    assert namespace["pad_to"](a, 32).shape == (32, 32)
    for scaling in ("tensorwise", "rowwise", "mx"):
        got = namespace["fp8_matmul"](a, b, (torch.float8_e4m3fn,) * 2, scaling)
        assert got.shape == (32, 48) and got.dtype == torch.bfloat16
        assert ((got.float() - a @ b.T).norm() / (a @ b.T).norm()) < 0.1


def test_the_cells_float8_linear_keeps_the_bias_and_its_gradient():
    namespace = cell_namespace()
    torch.manual_seed(0)
    linear = nn.Linear(32, 16)
    layer = namespace["Float8Linear"](linear, "tensorwise")
    assert {name for name, _ in layer.named_parameters()} == {"weight", "bias"}
    x = torch.randn(15, 32)
    y = layer(x)
    assert ((y - linear(x)).norm() / linear(x).norm()) < 0.1
    y.sum().backward()
    assert torch.allclose(linear.bias.grad, torch.full((16,), 15.0))
    bias_free = namespace["Float8Linear"](nn.Linear(32, 16, bias=False), "rowwise")
    assert bias_free.bias is None and bias_free(x).shape == (15, 16)


def test_the_cells_pad_to_leaves_an_aligned_tensor_alone():
    pad_to = cell_namespace()["pad_to"]
    x = torch.randn(4, 32)
    assert pad_to(x, 16) is x and pad_to(x, 32) is x


def test_the_cells_fp8_matmul_hands_the_scaled_matmul_only_shapes_cublas_accepts():
    """The scaled-matmul branch, simulated (no GPU here): mat1's columns and both dimensions of mat2
    must be multiples of 16 (Blas.cpp's checks), so b's rows are padded as well as the contraction,
    and the result is cut back to b's rows."""
    namespace = cell_namespace()
    seen = []

    def fake_scaled_mm(qa, qb, scale_a, scale_b, scaling):
        seen.append((tuple(qa.shape), tuple(qb.shape), tuple(scale_a.shape), tuple(scale_b.shape)))
        assert qa.shape[1] % 16 == 0 and qb.shape[0] % 16 == 0 and qb.shape[1] % 16 == 0
        return ((qa.float() * scale_a) @ (qb.float() * scale_b)).bfloat16()

    namespace.update(scaled_mm=fake_scaled_mm, FAST={"tensorwise": True, "rowwise": True})
    generator = torch.Generator().manual_seed(4)
    a, b = torch.randn(20, 15, generator=generator), torch.randn(30, 15, generator=generator)
    for scaling in ("tensorwise", "rowwise"):
        got = namespace["fp8_matmul"](a, b, (torch.float8_e4m3fn,) * 2, scaling)
        assert got.shape == (20, 30) and got.dtype == torch.bfloat16
        assert ((got.float() - a @ b.T).norm() / (a @ b.T).norm()) < 0.1
    rows = {"tensorwise": (1, 1), "rowwise": (20, 1)}
    assert seen == [((20, 16), (16, 32), rows[s], (1, 1) if s == "tensorwise" else (1, 32))
                    for s in ("tensorwise", "rowwise")]


def test_the_cells_pad_to_pads_any_axis_with_zeros():
    pad_to = cell_namespace()["pad_to"]
    x = torch.randn(30, 15)
    rows = pad_to(x, 16, dim=0)
    assert rows.shape == (32, 15) and torch.equal(rows[:30], x) and rows[30:].eq(0).all()
    assert pad_to(x, 16).shape == (30, 16) and pad_to(x, 16, dim=1).shape == (30, 16)
    assert pad_to(torch.randn(2, 3, 5), 4, dim=1).shape == (2, 4, 5)
