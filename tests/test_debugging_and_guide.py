"""helpers.debugging (first inf/NaN per module and per op), helpers.guide, and notebook 07's solutions."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers import debugging, exercises, guide
from helpers import device as device_module
from helpers.speed import DtypeSpeed
from helpers.solutions import nb07


def test_first_nonfinite_module_names_the_innermost_culprit():
    class Exp(nn.Module):
        def forward(self, x):
            return x.exp()

    model = nn.Sequential(nn.Identity(), Exp(), nn.Identity())
    found = debugging.first_nonfinite_module(model, torch.tensor([1.0, 12.0], dtype=torch.float16))
    assert (found.name, found.kind, found.inputs_finite, found.dtype) == ("1", "inf", True, torch.float16)
    assert "from finite inputs" in str(found)
    assert debugging.first_nonfinite_module(model, torch.tensor([1.0, 2.0], dtype=torch.float16)) is None
    assert all(not m._forward_hooks for m in model.modules()), "hooks must be removed"


def test_first_nonfinite_op_sees_inside_a_module_and_backward():
    x = torch.tensor([1.0, 12.0], dtype=torch.float16)
    result, found = debugging.first_nonfinite_op(lambda: (x.exp() - x.exp()).sum())
    assert found.name == "exp" and found.kind == "inf" and found.inputs_finite
    assert result.isnan()
    w = torch.tensor([3.0], requires_grad=True)
    loss = (w.to(torch.float16).float() * 1e5).sum()  # finite forward; the gradient 1e5 does not fit float16
    assert loss.isfinite()
    _, found = debugging.first_nonfinite_op(loss.backward)
    assert (found.name, found.kind, found.inputs_finite) == ("_to_copy", "inf", True)


def test_nonfinite_kind_prefers_nan():
    assert debugging.nonfinite_kind([torch.tensor([1.0]), torch.tensor([float("inf"), float("nan")])]) == "nan"
    assert debugging.nonfinite_kind(torch.tensor([float("-inf")])) == "inf"
    assert debugging.nonfinite_kind({"a": torch.ones(2), "b": torch.arange(3)}) == "finite"


def _profile(bf16_matmul: float) -> dict[str, DtypeSpeed]:
    return {"float32": DtypeSpeed("float32", 1.0, 1.0, ""),
            "bfloat16": DtypeSpeed("bfloat16", bf16_matmul, 1.7, ""),
            "float16": DtypeSpeed("float16", 0.01, 1.6, "")}


def test_hardware_class_comes_from_measurement_on_cpu_and_capability_on_cuda(monkeypatch):
    assert guide.hardware_class("cpu", _profile(2.5)) == "cpu-bf16"
    assert guide.hardware_class("cpu", _profile(0.01)) == "cpu-avx2"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for capability, expected in (((6, 1), "cuda-fp32"), ((7, 0), "cuda-fp16"), ((7, 5), "cuda-fp16"), ((8, 0), "cuda-bf16"),
                                 ((8, 9), "cuda-bf16"), ((9, 0), "cuda-bf16")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
        assert guide.hardware_class("cuda") == expected
    assert guide.hardware_class("mps") == "mps"


def test_guide_table_marks_one_row_and_names_its_backing():
    table = guide.guide_markdown(highlight="cpu-avx2")
    assert table.count("← this machine") == 1 and len(table.splitlines()) == 2 + len(guide.GUIDE)
    assert all(advice.backed_by for advice in guide.GUIDE.values())


def test_solution_07_1_the_island_fixes_it_and_the_broken_model_does_not():
    assert nb07.agreement(nb07.IslandAttention) == 8 == exercises.solution("07.1")
    assert not exercises._matches(nb07.agreement(nb07.Attention), exercises.solution("07.1"), 0.0)


def test_solution_07_2_is_the_boundary_of_overflow():
    k = exercises.solution("07.2")
    assert k < 24
    assert nb07.largest_finite_scale_exponent(start=k) == k
    assert nb07.largest_finite_scale_exponent(start=k + 1) == k  # k + 1 overflows


def _section_refs(text: str) -> list[tuple[str, str]]:
    """("03", "6") for each "03 §6" (and "04 §1–3" -> 1 and 3, "06 §6–7, §8") reference in ``text``."""
    import re

    refs = []
    for notebook, sections in re.findall(r"\b(0\d) ((?:§[\w]+(?:[–-]\d+)?(?:, )?)+)", text):
        for section in re.findall(r"§(\w+)", sections) + re.findall(r"[–-](\d+)", sections):
            refs.append((notebook, section))
    return refs


def test_guide_and_notebook_07_point_at_sections_that_exist():
    from pathlib import Path

    from tools.course_stats import notebook_path, section_stats

    texts = [Path(guide.__file__).read_text(),
             Path(notebook_path("07")).read_text()]
    refs = [ref for text in texts for ref in _section_refs(text)]
    assert len(refs) > 20
    sections = {notebook: section_stats(notebook_path(notebook)) for notebook in {n for n, _ in refs}}
    for notebook, section in refs:
        assert section in sections[notebook], f"{notebook} has no section {section}"
