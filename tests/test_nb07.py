"""helpers.nb07 (the rule's table of device kinds), the notebook's copy of the rule, and 07's solutions."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

import helpers
from helpers import exercises
from helpers import nb07 as guide
from helpers.solutions import nb07 as solutions
from tests.support import cells, source
from tests.support import text as notebook_text


def test_the_table_shows_every_kind_with_the_rules_advice():
    lines = guide.advice_table(helpers.choose_precision).splitlines()
    rows = [re.split(r"\s{2,}", line) for line in lines]
    assert rows[0] == ["device (made-up description)", "training", "batched inference", "chat decoding"]
    assert [row[0] for row in rows[1:]] == list(guide.KINDS)
    for row, description in zip(rows[1:], guide.KINDS.values()):  # each cell is the rule's, in short
        assert row[1:] == [guide.short(a) for a in helpers.choose_precision(description).values()], row
    table = {row[0]: row[1:] for row in rows[1:]}
    assert table["T4, RTX 20xx (sm_75)"] == ["fp16 autocast + GradScaler", "fp16 autocast",
                                             "fp16 weights, audit first"]
    assert table["x86 AVX512-BF16 (AMD Zen 4 on)"] == ["bf16 autocast", "bf16 weights", "measure"]
    assert table["x86 AVX2 (most laptops; AMD before Zen 4)"] == ["float32", "float32", "measure"]
    assert table["Other AMD GPUs (ROCm, e.g. gfx1100)"] == ["measure"] * 3
    assert table["AMD MI200, MI300 (ROCm gfx90a, gfx942)"] == ["bf16 autocast", "bf16 weights", "bf16 weights"]
    assert table["V100 (sm_70)"] == ["fp16 autocast + GradScaler", "fp16 autocast", "fp16 weights, audit first"]
    assert table["Apple GPU, torch 2.5-2.7 (untested here)"] == ["float32", "fp16 autocast", "measure"]
    assert table["Apple GPU, torch 2.8+ (untested here)"] == ["measure", "fp16 autocast", "measure"]  # no Mac run
    assert not [row for row in rows[1:] if row[0].startswith("Apple GPU") and "bf16" in " ".join(row[1:])]


@pytest.mark.parametrize("name, cores", [
    ("NVIDIA GeForce GTX 1650", False), ("NVIDIA GeForce GTX 1660 Ti", False), ("NVIDIA T400 4GB", False),
    ("NVIDIA T500", False), ("NVIDIA T550 Laptop GPU", False), ("NVIDIA T600 Laptop GPU", False),
    ("NVIDIA T1000 8GB", False), ("Quadro T1000", False), ("NVIDIA Quadro T1200 Laptop GPU", False),
    ("Quadro T2000 with Max-Q Design", False), ("NVIDIA GeForce MX450", False),
    ("Tesla T4", True), ("Quadro RTX 4000", True), ("NVIDIA GeForce RTX 2060", True),
    ("NVIDIA RTX A2000", True), ("NVIDIA TITAN RTX", True)])
def test_tensor_cores_leaves_out_every_tu116_and_tu117_part(monkeypatch, name, cores):
    """sm_75 parts without tensor cores (TU116/TU117: GTX 16xx, MX450/550, T400-T2000, datasheets)."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    capability = (8, 6) if "A2000" in name else (7, 5)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert (torch.float16 in helpers.precision.native_dtypes(helpers.precision.describe_device("cuda"))) is cores


def test_notebooks_07_and_08_promise_no_speed_everywhere():
    for name in ("notebooks/07_choosing_and_troubleshooting.ipynb",
                 "notebooks/08_transformers_in_mixed_precision.ipynb", "helpers/nb07.py"):
        text = notebook_text(ROOT / name) if name.endswith(".ipynb") else (ROOT / name).read_text()
        assert not re.search(r"everywhere|anywhere|on every (machine|CPU)", text, re.I), name


OVERCLAIMS = r"any hardware|tie or win everywhere|still gain|on every machine|win (anyway|everywhere)"


def test_no_text_promises_that_half_the_bytes_win_on_every_machine():
    for name in SPEED_TEXTS:
        # the prose and code, not old outputs
        text = notebook_text(ROOT / name) if name.endswith(".ipynb") else (ROOT / name).read_text()
        assert not re.search(OVERCLAIMS, text, re.I), name


ROOT = Path(__file__).resolve().parent.parent
SPEED_TEXTS = ["helpers/precision.py", "helpers/nb00.py", "helpers/nb07.py", "helpers/device.py",
               "notebooks/00_setup_and_number_formats.ipynb", "notebooks/07_choosing_and_troubleshooting.ipynb"]


def slow_claims_without_a_regime(text: str) -> list[str]:
    """Sentences that call 16-bit matmuls (or 16-bit math) slow without naming the batch or intensity."""
    sentences = re.split(r"(?<=[.;!?])\s+|\n\n", text)
    sixteen_bit = r"\b(16-bit|bf16|fp16|b?float16|matmuls?)\b"
    regime = r"batch|FLOP|intensity|compute-bound|crossover|memory-bound|\{"
    return [s for s in sentences
            if re.search(r"slow", s, re.I) and re.search(sixteen_bit, s) and not re.search(regime, s)]


def test_no_sentence_calls_16_bit_matmuls_slow_without_naming_where():
    assert slow_claims_without_a_regime("On a laptop, bf16 matmuls are about 100x slower.")
    assert not slow_claims_without_a_regime("Above batch 16, bf16 matmuls are slower.")
    for name in SPEED_TEXTS:
        text = notebook_text(ROOT / name) if name.endswith(".ipynb") else (ROOT / name).read_text()
        assert slow_claims_without_a_regime(text) == [], name


class Rescaled(solutions.Attention):  # the 1/sqrt(d) the exercise rules out, in a float32 island
    def forward(self, x):
        q, k = self.query(x).float() / 128**0.5, self.key(x).float()
        return torch.softmax(q @ k.transpose(-2, -1), dim=-1).to(x.dtype) @ self.value(x)


class CastTooLate(solutions.Attention):  # float32 after the float16 product: the inf exists
    def forward(self, x):
        scores = (self.query(x) @ self.key(x).transpose(-2, -1)).float()
        return torch.softmax(scores, dim=-1).to(x.dtype) @ self.value(x)


class Clamped(solutions.Attention):  # hides the overflow: the cell prints "agree: 8"
    def forward(self, x):
        return torch.softmax(self.scores(x).clamp(-6e4, 6e4), dim=-1) @ self.value(x)


class NanToNum(solutions.Attention):  # hides the NaN: the cell prints "agree: 8" too
    def forward(self, x):
        return torch.softmax(self.scores(x), dim=-1).nan_to_num() @ self.value(x)


class HalfSoftmax(solutions.Attention):  # the product in float32, the softmax back in float16
    def forward(self, x):
        scores = self.query(x).float() @ self.key(x).float().transpose(-2, -1)
        return torch.softmax(scores.to(x.dtype), dim=-1) @ self.value(x)


class NoCastBack(solutions.Attention):  # float32 weights meet float16 values: an error
    def forward(self, x):
        q, k = self.query(x).float(), self.key(x).float()
        return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ self.value(x)


class NoWidth(nn.Module):  # a module that does not take the width: feedback, not an exception
    def __init__(self):
        super().__init__()


class WrittenDifferently(solutions.Attention):  # a right island in other words
    def forward(self, x):
        scores = torch.matmul(self.query(x).to(torch.float32), self.key(x).to(torch.float32).mT)
        return scores.softmax(dim=-1).type_as(x) @ self.value(x)


def test_exercise_07_1_judges_the_repaired_class_and_names_what_fails():
    assert solutions.agreement(solutions.IslandAttention) == 8  # the fix agrees on every reading
    for hiding in (Clamped, NanToNum, Rescaled):  # so do two symptom-hiders and the rescaling
        assert solutions.agreement(hiding) == 8 == solutions.agreement(hiding, seed=1)
    expected = {8: "class itself", solutions.IslandAttention(128): "not an instance",
                solutions.Attention: "`matmul` still makes inf",
                Clamped: "clamp or nan_to_num", NanToNum: "clamp or nan_to_num",
                CastTooLate: "still makes inf", Rescaled: "no 1/sqrt(d)",
                HalfSoftmax: "still makes inf", NoCastBack: "raised RuntimeError",
                NoWidth: "raised TypeError"}
    for answer, words in expected.items():
        reason = exercises.feedback("07.1", answer)
        assert reason is not None and words in reason and "\n" not in reason, (answer, reason)
        assert "float16" not in reason.split(":")[0] or "still" in reason  # names a condition
    for right in (solutions.IslandAttention, WrittenDifferently):
        assert exercises.feedback("07.1", right) is None
        assert exercises.grade("07.1", right) is True


def test_section_6_links_and_runs_the_take_home_recipe_file():
    """07 §6 walks through notebooks/take_home_recipe.py (tested on its own in tests/test_take_home_recipe.py)
    and runs it in one cell; the old in-notebook recipe, which imported helpers, is gone."""
    from tools.course_stats import notebook_path

    all_cells = cells(notebook_path("07"))
    sources = [source(c) for c in all_cells]
    start = next(i for i, s in enumerate(sources) if s.startswith("## 6."))
    end = next(i for i, s in enumerate(sources) if s.startswith("## Summary"))
    section = sources[start:end]
    assert "[`take_home_recipe.py`](take_home_recipe.py)" in section[0]
    code = [s for c, s in zip(all_cells[start:end], section) if c["cell_type"] == "code"]
    assert code[0] == "%run take_home_recipe.py" and len(code) == 2
    assert code[1].endswith("%run take_home_recipe.py --device-description {t4!r}") and "Tesla T4" in code[1]
    assert (Path(notebook_path("07")).parent / "take_home_recipe.py").exists()
    outputs = "".join("".join(o.get("text", "")) for c in all_cells[start:end] for o in c.get("outputs", []))
    assert "training" in outputs and "Checkpoint restored" in outputs  # committed executed


def test_the_checks_leave_the_learners_random_state_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    for key, answer in (("07.1", solutions.IslandAttention), ("07.2", 3), ("08.1", 0.3),
                        ("08.2", 1), ("08.3", lambda s, a: s.softmax(-1))):
        exercises.feedback(key, answer)
    assert torch.equal(torch.get_rng_state(), before)


def test_solution_07_2_is_the_boundary_of_overflow():
    k = exercises.solution("07.2")
    assert k < 24
    assert solutions.largest_finite_scale_exponent(start=k) == k
    assert solutions.largest_finite_scale_exponent(start=k + 1) == k  # k + 1 overflows


def _section_refs(text: str) -> list[tuple[str, str]]:
    """("03", "6") for each "03 §6" (and "04 §1–3" -> 1 and 3, "06 §6–7, §8") reference in ``text``."""
    refs = []
    for notebook, sections in re.findall(r"\b(0\d) ((?:§[\w]+(?:[–-]\d+)?(?:, )?)+)", text):
        for section in re.findall(r"§(\w+)", sections) + re.findall(r"[–-](\d+)", sections):
            refs.append((notebook, section))
    return refs


def test_guide_and_notebook_07_point_at_sections_that_exist():
    from tools.course_stats import notebook_path, section_stats

    texts = [Path(guide.__file__).read_text(),
             Path(notebook_path("07")).read_text()]
    refs = [ref for text in texts for ref in _section_refs(text)]
    assert len(refs) > 20
    sections = {notebook: section_stats(notebook_path(notebook)) for notebook in {n for n, _ in refs}}
    for notebook, section in refs:
        assert section in sections[notebook], f"{notebook} has no section {section}"


def _notebook_code(key: str) -> str:
    from tools.course_stats import notebook_path

    code = [source(c) for c in cells(notebook_path(key)) if c["cell_type"] == "code"]
    return "\n\n".join(text for text in code if not text.startswith("%"))  # IPython magics: not Python


def test_section_3_types_its_op_finder_as_a_dispatch_mode():
    code = _notebook_code("07")
    assert "class FirstNonFinite(TorchDispatchMode):" in code and "def __torch_dispatch__(" in code
    assert "first_nonfinite_op" not in code


def test_stop_7_ends_section_6_with_its_recap():
    from tools.course_stats import notebook_path

    sources = [source(c) for c in cells(notebook_path("07"))]
    start = next(i for i, s in enumerate(sources) if s.startswith("## 6."))
    end = next(i for i, s in enumerate(sources) if s.startswith("## Summary"))
    recap = sources[end - 1]
    assert start < end - 1 and recap.startswith("**Recap of this stop.**") and len(recap.split()) <= 80
