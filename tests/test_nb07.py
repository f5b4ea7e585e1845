"""helpers.nb07 (the decision guide, hardware_class) and notebook 07's solutions."""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from helpers import exercises, nb07 as guide
from helpers.speed import DtypeSpeed
from helpers.solutions import nb07 as solutions


def _profile(bf16_matmul: float) -> dict[str, DtypeSpeed]:
    return {"float32": DtypeSpeed("float32", 1.0, 1.0, ""),
            "bfloat16": DtypeSpeed("bfloat16", bf16_matmul, 1.7, ""),
            "float16": DtypeSpeed("float16", 0.01, 1.6, "")}


def test_hardware_class_comes_from_measurement_on_cpu_and_capability_on_cuda(monkeypatch):
    assert guide.hardware_class("cpu", _profile(2.5)) == "cpu-bf16"
    assert guide.hardware_class("cpu", _profile(0.01)) == "cpu-avx2"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA test GPU")
    for capability, expected in (((6, 1), "cuda-fp32"), ((7, 0), "cuda-fp16"), ((7, 5), "cuda-fp16"), ((8, 0), "cuda-bf16"),
                                 ((8, 9), "cuda-bf16"), ((9, 0), "cuda-bf16")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
        assert guide.hardware_class("cuda") == expected
    assert guide.hardware_class("mps") == "mps"


def guide_rows() -> dict[str, list[str]]:
    """Notebook 07's decision guide: row name -> its cells (Hardware, Batch 1, Batched, Training, Shown in)."""
    from tools.course_stats import notebook_path

    cells = json.loads(Path(notebook_path("07")).read_text())["cells"]
    table = next("".join(c["source"]) for c in cells if "".join(c["source"]).startswith("**The decision guide"))
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| `")]
    return {row[0].strip("| `"): [cell.strip(" |") for cell in row[1:]] for row in rows}


def test_the_guide_has_a_row_for_every_class_each_backed_and_split_by_workload_shape():
    rows = guide_rows()
    assert list(rows) == list(guide.CLASSES)
    assert all(len(cells) == 5 and all(cells) for cells in rows.values())  # a backing for every row
    hardware, decoding, batched, training, backed_by = rows["cpu-avx2"]
    assert "16-bit weights" in decoding and "crossover" in decoding  # memory-bound: the measured ratio decides
    assert batched.startswith("float32") and "crossover" in batched  # compute-bound: emulated is slow
    assert "Ice Lake" in hardware and "batch-1 ratio" in decoding  # AVX512 without BF16 measures here
    assert "Sapphire Rapids" in rows["cpu-bf16"][0] and "Cooper Lake" in rows["cpu-bf16"][0]
    assert "GradScaler where fp16 measures faster" in rows["cuda-fp32"][2]  # P100 / GTX 16xx
    assert "MX450" in rows["cuda-fp32"][0] and "not measured here" in rows["mps"][0]


OVERCLAIMS = r"any hardware|tie or win everywhere|still gain|on every machine|win (anyway|everywhere)"


def test_no_text_promises_that_half_the_bytes_win_on_every_machine():
    for name in SPEED_TEXTS:
        text = (ROOT / name).read_text()
        if name.endswith(".ipynb"):  # the prose and code, not old outputs
            text = "\n\n".join("".join(cell["source"]) for cell in json.loads(text)["cells"])
        assert not re.search(OVERCLAIMS, text, re.I), name


ROOT = Path(__file__).resolve().parent.parent
SPEED_TEXTS = ["helpers/speed.py", "helpers/nb00.py", "helpers/nb07.py", "helpers/device.py",
               "notebooks/00_setup_and_number_formats.ipynb", "notebooks/07_choosing_and_troubleshooting.ipynb"]


def slow_claims_without_a_regime(text: str) -> list[str]:
    """Sentences that call 16-bit matmuls (or 16-bit math) slow without naming the batch or intensity."""
    sentences = re.split(r"(?<=[.;!?])\s+|\n\n", text)
    return [s for s in sentences if re.search(r"slow", s, re.I) and re.search(r"\b(16-bit|bf16|fp16|b?float16|matmuls?)\b", s)
            and not re.search(r"batch|FLOP|intensity|compute-bound|crossover|memory-bound|\{", s)]


def test_no_sentence_calls_16_bit_matmuls_slow_without_naming_where():
    assert slow_claims_without_a_regime("On a laptop, bf16 matmuls are about 100x slower.")
    assert not slow_claims_without_a_regime("Above batch 16, bf16 matmuls are slower.")
    for name in SPEED_TEXTS:
        text = (ROOT / name).read_text()
        if name.endswith(".ipynb"):
            text = "\n\n".join("".join(cell["source"]) for cell in json.loads(text)["cells"])
        assert slow_claims_without_a_regime(text) == [], name


class Rescaled(solutions.Attention):  # the 1/sqrt(d) the exercise rules out, in a float32 island
    def forward(self, x):
        q, k = self.query(x).float() / 128**0.5, self.key(x).float()
        return torch.softmax(q @ k.transpose(-2, -1), dim=-1).to(x.dtype) @ self.value(x)


class CastTooLate(solutions.Attention):  # float32 after the float16 product: the inf exists
    def forward(self, x):
        scores = (self.query(x) @ self.key(x).transpose(-2, -1)).float()
        return torch.softmax(scores, dim=-1).to(x.dtype) @ self.value(x)


def test_exercise_07_1_judges_the_repaired_class_not_a_typed_number():
    grade = exercises.grade
    assert solutions.agreement(solutions.IslandAttention) == 8  # the fix agrees on every reading
    assert solutions.agreement(Rescaled) == 8  # ... and so does the forbidden rescaling: hence
    wrong = [8, solutions.Attention, Rescaled, CastTooLate]  # the check looks at the class
    assert [grade("07.1", answer) for answer in wrong] == [False] * len(wrong)
    assert grade("07.1", solutions.IslandAttention) is True


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
