"""Notebook 11's scaffolding (helpers.nb11), its quantisers as typed in its cells, and its exercise judges, fed
the plausible wrong answers."""
import torch
from torch import nn

from helpers import nb11 as lab
from helpers.exercises import feedback, grade
from helpers.solutions import nb11 as solutions
from tests.support import definitions

# ---- 11.1: textbook uint4 per group --------------------------------------------------------------------------


def _groups(w, group):
    return w.unflatten(-1, (-1, group))


def no_zero_point(w, group):
    groups = _groups(w, group)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = (high - low) / 15
    z = torch.zeros_like(scale)
    return (torch.round(groups / scale[..., None]) + z[..., None]).clamp(0, 15).flatten(-2), scale, z


def groups_down_the_columns(w, group):
    q, scale, z = solutions.textbook_int4(w.t(), group)  # groups of consecutive weights of a column
    return q.t(), scale.t(), z.t()


def groups_down_the_columns_unflattened(w, group):
    groups = w.unflatten(0, (-1, group))  # (rows / group, group, K)
    low, high = groups.amin(1), groups.amax(1)
    scale = (high - low) / 15
    z = torch.round(-low / scale).clamp(0, 15)
    q = (torch.round(groups / scale[:, None]) + z[:, None]).clamp(0, 15)
    return q.flatten(0, 1), scale, z


def rounding_before_scaling(w, group):
    groups = _groups(w, group)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = (high - low) / 15
    z = torch.round(-low / scale).clamp(0, 15)
    q = (torch.round(groups) / scale[..., None] + z[..., None]).clamp(0, 15)
    return q.flatten(-2), scale, z


def signed_int4(w, group):
    groups = _groups(w, group)
    scale = groups.abs().amax(-1) / 7
    q = torch.round(groups / scale[..., None]).clamp(-8, 7)
    return q.flatten(-2), scale, torch.zeros_like(scale)


def eight_bit_range(w, group):
    groups = _groups(w, group)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = (high - low) / 255
    z = torch.round(-low / scale).clamp(0, 255)
    return (torch.round(groups / scale[..., None]) + z[..., None]).clamp(0, 255).flatten(-2), scale, z


def sixteen_steps(w, group):
    groups = _groups(w, group)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = (high - low) / 16
    z = torch.round(-low / scale).clamp(0, 15)
    return (torch.round(groups / scale[..., None]) + z[..., None]).clamp(0, 15).flatten(-2), scale, z


def float_zero(w, group):  # the kernel's convention handed in as the textbook one
    groups = _groups(w, group)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = (high - low) / 15
    q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15)
    return q.flatten(-2), scale, low + 8 * scale


def test_the_reference_is_accepted_in_any_integer_or_float_dtype_and_with_keepdim():
    assert grade("11.1", solutions.textbook_int4) is True

    def as_uint8_keepdim(w, group):
        q, scale, z = solutions.textbook_int4(w, group)
        return q.to(torch.uint8), scale[..., None], z.to(torch.int32)[..., None]
    assert feedback("11.1", as_uint8_keepdim) is None


def test_every_group_of_the_checks_weights_has_both_signs():
    w, group = solutions.exercise_11_1_inputs()
    groups = _groups(w, group)
    assert (groups.amin(-1) < 0).all() and (groups.amax(-1) > 0).all()
    assert w.abs().max() < 0.5  # round(w) is 0 everywhere: rounding before scaling shows as q == z


def test_the_reference_reconstructs_within_a_step():
    w, group = solutions.exercise_11_1_inputs()
    q, scale, z = solutions.textbook_int4(w, group)
    approx = ((_groups(q, group) - z[..., None]) * scale[..., None]).flatten(-2)
    assert ((w - approx).abs() <= scale.repeat_interleave(group, -1) * (1 + 1e-5)).all()
    assert q.min() >= 0 and q.max() <= 15


def test_the_notebooks_buggy_cell_is_rejected_naming_the_zero_point():
    (int4_textbook,) = definitions("11", "int4_textbook", namespace={"torch": torch}).values()
    assert "zero point" in feedback("11.1", int4_textbook)


def test_an_asymmetric_range_without_a_zero_point_is_named():
    assert "zero point" in feedback("11.1", no_zero_point)
    assert "z is None" in feedback("11.1", lambda w, g: (*no_zero_point(w, g)[:2], None))


def test_groups_along_the_wrong_axis_are_named():
    for answer in (groups_down_the_columns, groups_down_the_columns_unflattened):
        assert "down the columns" in feedback("11.1", answer)


def test_rounding_before_scaling_is_named():
    assert "rounded before the division" in feedback("11.1", rounding_before_scaling)

    def fractional(w, group):  # within [0, 15], but not whole codes
        q, scale, z = solutions.textbook_int4(w, group)
        return torch.where(q > 0, q - 0.5, q), scale, z
    assert "fractional" in feedback("11.1", fractional)


def test_values_outside_the_stated_range_are_named():
    assert "signed int4" in feedback("11.1", signed_int4)
    assert "0 to 15" in feedback("11.1", eight_bit_range)


def test_sixteen_steps_and_a_float_zero_are_named():
    assert "divide by 15" in feedback("11.1", sixteen_steps)
    assert "kernel's convention" in feedback("11.1", float_zero)


def test_other_wrong_shapes_and_types_are_named():
    assert "function" in feedback("11.1", 0.53)
    assert "three tensors" in feedback("11.1", lambda w, g: solutions.textbook_int4(w, g)[:2])
    assert "shape" in feedback("11.1", lambda w, g: (solutions.textbook_int4(w, g)[0].flatten(), *solutions
                                                      .textbook_int4(w, g)[1:]))
    assert grade("11.1", None) is None


# ---- 11.2: bytes per weight -----------------------------------------------------------------------------------


def test_bytes_per_weight_right_answer_is_accepted():
    assert grade("11.2", 0.5625) is True
    assert grade("11.2", torch.tensor(0.5 + 4 / 64)) is True


def test_bytes_per_weight_wrong_answers_are_named():
    assert "only the codes" in feedback("11.2", 0.5)
    assert "scale and a zero" in feedback("11.2", 0.5 + 2 / 64)
    assert "float32" in feedback("11.2", 0.625)
    assert "two codes share" in feedback("11.2", 1.0625)
    assert "bits" in feedback("11.2", 4.5)
    assert "number" in feedback("11.2", "0.5625")
    assert "hint" in feedback("11.2", 0.7)


# ---- the notebook's quantisers, as typed in its cells ---------------------------------------------------------


def _cell_quantisers():
    return definitions("11", "int8_per_row", "int4_groupwise", "dequantise_int8", "dequantise_int4",
                       "pack_two_per_byte", namespace={"torch": torch})


def test_the_cells_int4_is_the_kernel_convention_and_hits_both_ends_of_each_group():
    quantisers = _cell_quantisers()
    w = torch.randn(16, 128, generator=torch.Generator().manual_seed(0))
    q, scale, zero = quantisers["int4_groupwise"](w, 32)
    approx = quantisers["dequantise_int4"](q, scale, zero)
    groups, approx_groups = _groups(w, 32), _groups(approx, 32)
    assert q.dtype == torch.uint8 and q.max() == 15 and q.min() == 0
    assert torch.allclose(approx_groups.amin(-1), groups.amin(-1), atol=1e-6)
    assert torch.allclose(approx_groups.amax(-1), groups.amax(-1), atol=1e-6)
    assert ((w - approx).abs() <= scale.repeat_interleave(32, -1) / 2 + 1e-6).all()


def test_the_cells_int8_and_packing_round_trip():
    quantisers = _cell_quantisers()
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
    q, scale = quantisers["int8_per_row"](w)
    assert q.dtype == torch.int8 and q.abs().max() == 127
    assert ((w - quantisers["dequantise_int8"](q, scale)).abs() <= scale[:, None] / 2 + 1e-7).all()
    codes = torch.randint(0, 16, (4, 10), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    packed = quantisers["pack_two_per_byte"](codes)
    assert packed.shape == (4, 5) and torch.equal(packed >> 4, codes[:, ::2])
    assert torch.equal(packed & 15, codes[:, 1::2])


def test_the_textbook_to_kernel_conversion_the_notebook_states():
    """(q - z) * scale == (q - 8) * scale + (8 - z) * scale: zero = (8 - z) * scale, as section 2 says."""
    generator = torch.Generator().manual_seed(3)
    q = torch.randint(0, 16, (4, 64), generator=generator).float()
    z = torch.randint(0, 16, (4, 1), generator=generator).float()
    scale = torch.rand(4, 1, generator=generator)
    assert torch.allclose((q - z) * scale, (q - 8) * scale + (8 - z) * scale, atol=1e-6)


# ---- helpers.nb11 ---------------------------------------------------------------------------------------------


def test_agreement_counts_positions_and_identical_rows():
    reference = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    generated = torch.tensor([[1, 2, 3, 4], [5, 0, 7, 8]])
    assert lab.agreement(generated, reference) == (7 / 8, 1)


def test_greedy_decodes_as_08_generate_does():
    from helpers import nb08

    model = lab.GPT(width=32, layers=1, heads=2, context=24)
    prompt = "The cache "
    ids = nb08.encode(prompt)[None]
    assert nb08.decode(lab.greedy(model.eval(), ids, 8)[0]) == nb08.generate(model, prompt, 8)


def test_buffer_bytes_counts_parameters_and_buffers():
    layer = nn.Linear(8, 4, bias=False)
    layer.register_buffer("codes", torch.zeros(4, 8, dtype=torch.int8))
    assert lab.buffer_bytes(layer) == 4 * 8 * 4 + 4 * 8
    assert lab.linear_shapes(nn.Sequential(layer, nn.Linear(4, 2))) == [(4, 8), (2, 4)]


def test_prompts_are_seeded_windows():
    ids = torch.arange(1000)
    first, again = lab.prompts(ids, 3, 5, seed=1), lab.prompts(ids, 3, 5, seed=1)
    assert first.shape == (3, 5) and torch.equal(first, again)
    assert torch.equal(first[:, 1:] - first[:, :-1], torch.ones(3, 4, dtype=torch.long))


def test_tables_align_their_columns():
    text = lab.accuracy_table({"a": {"loss": 0.25, "same of 16": 16}, "longer": {"loss": 1.0, "same of 16": 3}})
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1 and "0.2500" in lines[1] and lines[2].endswith("3")
    table = lab.formats_table([("x", "1"), ("yy", "22")], ("format", "n"))
    assert table.splitlines()[0].startswith("format  n") and table.splitlines()[2] == "yy      22"


# ---- notebook 11's release branch, §5's arithmetic, the kernels' platform table ------------------------------


class _Torch25:
    """torch 2.5 as pack_int4 sees it: no `_for_cpu` op, a version of 2.5.1, a recording packing op."""
    __version__ = torch.torch_version.TorchVersion("2.5.1")
    uint8 = torch.uint8

    def _convert_weight_to_int4pack(self, packed, inner_k_tiles):
        self.seen = packed
        return packed


def test_torch_2_5_gets_codes_two_a_byte_even_column_high():
    fake = _Torch25()
    (pack_int4,) = definitions("11", "pack_int4", namespace={"torch": fake}).values()
    codes = torch.randint(0, 16, (4, 8), generator=torch.Generator().manual_seed(0))
    pack_int4(codes)
    assert fake.seen.dtype == torch.uint8 and fake.seen.shape == (4, 4)
    assert torch.equal(fake.seen >> 4, codes[:, ::2].to(torch.uint8))
    assert torch.equal(fake.seen & 15, codes[:, 1::2].to(torch.uint8))


def test_the_memory_fit_keeps_embedding_and_head_16_bit():
    (model_bytes,) = definitions("11", "model_bytes").values()
    kept = 2 * 128_256 * 4_096
    int8 = model_bytes(1 + 4 / 4096, 8.03e9, kept) / 2**30
    int4 = model_bytes(0.5 + 4 / 128, 8.03e9, kept) / 2**30
    assert 8.4 < int8 < 8.5 and int8 > 8  # does not fit an 8 GiB laptop
    assert 5.3 < int4 < 5.5 and int4 + 2 < 8  # fits beside a 2 GiB reserve
    assert model_bytes(2.0, 8.03e9, kept) == 2 * 8.03e9


def test_the_kernels_platform_table():
    (table,) = definitions("11", "vectorised_activations").values()
    assert table("Linux", "x86_64", "AVX512") == {"bf16"} == table("Darwin", "x86_64", "AVX2")
    assert table("Windows", "AMD64", "AVX512") == set() == table("Windows", "ARM64", "DEFAULT")
    assert table("Linux", "aarch64", "DEFAULT") == {"float32", "fp16", "bf16"}
    assert table("Darwin", "arm64", "DEFAULT") == {"float32", "fp16", "bf16"}
    assert table("Linux", "x86_64", "DEFAULT") == set()
