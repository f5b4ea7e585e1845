"""helpers.nb00 (the roofline's reading, the verdict and format tables) and notebook 00's solutions."""
import statistics

import pytest
import torch

from helpers import exercises
from helpers import nb00 as lab
from helpers.roofs import Roofs
from tests.support import fresh_part

SIZE = 4096


def linear(dtype: str, batch: int, seconds: float) -> lab.Point:
    nbytes = (SIZE * SIZE + 2 * batch * SIZE) * (4 if dtype == "float32" else 2)
    return lab.Point(dtype, "linear", batch, 2 * batch * SIZE * SIZE, nbytes, seconds)


def fp32_seconds(batch: int) -> float:
    """A fake machine: 40 GB/s, 100 GFLOP/s in float32; its ridge is near 2.5 FLOP/byte (batch ~5)."""
    point = linear("float32", batch, 1.0)
    return max(point.nbytes / 40e9, point.flops / 100e9)


def sweep(bf16: dict[int, float], fp16: dict[int, float]) -> list[lab.Point]:
    """float32 on the fake machine at batches 1-64; 16-bit linears at the given speed ratios to it; adds
    at 40 GB/s and a tiny add at 2 us."""
    points = [linear("float32", b, fp32_seconds(b)) for b in (1, 4, 16, 64)]
    points += [linear("bfloat16", b, fp32_seconds(b) / r) for b, r in bf16.items()]
    points += [linear("float16", b, fp32_seconds(b) / r) for b, r in fp16.items()]
    for dtype, size in (("float32", 4), ("bfloat16", 2), ("float16", 2)):
        points.append(lab.Point(dtype, "add", 1 << 24, 1 << 24, 3 * size << 24, 3 * size * (1 << 24) / 40e9))
        points.append(lab.Point(dtype, "add", 1024, 1024, 3 * size * 1024, 2e-6))
    return points


ROOFS = Roofs({"float32": 100e9, "bfloat16": 200e9}, {"float32": 1024, "bfloat16": 1024}, 40e9, 1,
              emulated=("float16",))  # bf16 native, fp16 emulated (a Zen 4)


def test_the_roofs_are_measured_not_taken_from_the_sweep():
    roofline = lab.Roofline(sweep({1: 2.0, 4: 1.5}, {1: 2.0}), ROOFS)
    assert roofline.roofs.ridge("float32") == pytest.approx(2.5)
    point = linear("bfloat16", 1, 0.5)
    assert point.intensity == pytest.approx(2 * SIZE * SIZE / ((SIZE * SIZE + 2 * SIZE) * 2))
    fp32_batch_1 = roofline.linear("float32", 1)  # memory-bound at 40 GB/s on the fake machine
    assert roofline.fraction(fp32_batch_1) == pytest.approx(1.0)
    assert "float32 GEMM (n=1024):   100.0 GFLOP/s, ridge at   2.50 FLOP/byte" in str(roofline)


def test_the_crossover_and_its_reason_follow_the_fractions_of_the_roofs():
    roofline = lab.Roofline(sweep(bf16={1: 2.0, 4: 1.33, 16: 0.2}, fp16={1: 0.95, 4: 0.5}), ROOFS)
    assert roofline.ties_up_to("bfloat16") == 4 and roofline.ties_up_to("float16") == 1
    text = str(roofline)
    assert ("bfloat16 weights: keeps up to batch 4; from batch 16 under 0.9x float32 (this bfloat16 "
            "kernel runs far below its compute roof") in text
    assert ("float16 weights: keeps up to batch 1; from batch 4 under 0.9x float32 (no roof here for "
            "float16 (emulated): the kernel decides)") in text
    assert " float16 GEMM" not in text and "no roof" in roofline.table().splitlines()[1]
    slow_fp16 = Roofs({**ROOFS.compute, "float16": 50e9}, {**ROOFS.gemm_n, "float16": 1024}, 40e9, 1)
    text = str(lab.Roofline(sweep(bf16={1: 2.0}, fp16={1: 2.0, 4: 0.5}), slow_fp16))
    assert "from batch 4 under 0.9x float32 (intensity 4.0 is past float16's GEMM ridge (1.25)" in text
    native = lab.Roofline(sweep(bf16={1: 1.9, 4: 1.8, 16: 2.0, 64: 2.0}, fp16={1: 0.5, 4: 1.0}), ROOFS)
    assert native.ties_up_to("bfloat16") == 64
    assert "at every batch measured, 1 to 64" in str(native)
    assert "overhead-bound: a float32 add of 1,024 elements takes 2.0 us, 6.1 GB/s: 15% of" in str(native)


MiB = 1 << 20


@pytest.mark.parametrize("llc", [8 * MiB, 32 * MiB, 300 * MiB, 1126 * MiB])  # laptop .. Genoa-X
def test_sweep_sizes_stream_past_the_cache_within_a_budget_or_say_they_did_not(monkeypatch, llc):
    monkeypatch.setattr(lab, "last_level_cache_bytes", lambda: llc)  # simulated: no allocation
    size, batches, elements, in_cache = lab.sweep_sizes("cpu")
    assert size * size >= elements and size % 256 == 0 and elements >= 1 << 22
    assert in_cache is (size * size * 2 < 2 * llc)  # said, not assumed
    assert (not in_cache) is (llc <= 32 * MiB)  # the cap (128 MiB in 16 bits) leaves big caches inside
    assert batches[0] == 1 and batches[-1] >= 32  # past every ridge measured in the course
    assert 2 * batches[-1] * size * size <= lab.SWEEP_FLOPS or batches[-1] == 32  # the time budget
    assert lab.sweep_sizes("mps")[0] == lab.sweep_sizes("cuda")[0] == 8192


def test_format_and_bit_tables_name_every_format():
    table = lab.format_table()
    assert "e4m3fn" in table and "e5m2" in table and "6.55e+04" in table
    assert "float16: 0 | 01111    | 0000000000" in lab.bit_table((1.0,), (torch.float16,))


# --- exercise 00.4 (fix the code): a float16 running mean ---

grade = exercises.grade


def running_mean(dtype: torch.dtype):
    """The exercise's loop, with its running total in ``dtype`` (float16: the code as given)."""
    def mean_of(losses: torch.Tensor) -> float:
        total = torch.zeros((), dtype=dtype)
        for loss in losses:
            total = total + loss
        return (total / len(losses)).item()
    return mean_of


def test_exercise_00_4_wrong_answers_are_not_yet_and_fixes_are_accepted():
    losses = lab.logged_losses()
    wrong = [running_mean(torch.float16), 2.3, losses.float().median().item(),  # the given code;
             running_mean(torch.float32)(losses),  # the text's "about 2.3"; the median; a number,
             lambda x: 2.3, lambda x: x.float().median().item()]  # not the repaired function
    assert [grade("00.4", answer) for answer in wrong] == [False] * len(wrong)
    fixes = [running_mean(torch.float32), running_mean(torch.float64),  # a float32 accumulator
             lambda x: (x.sum() / len(x)).item(), lambda x: x.mean().item(),  # one reduction
             lambda x: x.float().mean().item(), lambda x: x.float().sum().item() / x.numel()]
    assert [grade("00.4", answer) for answer in fixes] == [True] * len(fixes)


def test_exercise_00_4_rejects_n_minus_1_and_names_it():
    """Divided by n - 1: within 1e-4 of the mean on 10,000 losses, so the seven-loss input catches it."""
    reason = exercises.feedback("00.4", lambda x: (x.float().sum() / (len(x) - 1)).item())
    assert reason is not None and "seven float16 losses" in reason and "n - 1 (6)" in reason


def test_exercise_00_4_rejects_a_typed_count_of_10000_and_names_it():
    reason = exercises.feedback("00.4", lambda x: (x.float().sum() / 10_000).item())
    assert reason is not None and "seven float16 losses" in reason and "10,000 whatever the count" in reason
    loop = exercises.feedback("00.4", lambda x: sum(float(v) for v in x) / 10_000)  # the loop, count typed
    assert loop is not None and "len(losses)" in loop


def test_exercise_00_4_names_the_stalled_float16_total():
    reason = exercises.feedback("00.4", running_mean(torch.float16))
    assert reason is not None and "notebook's losses" in reason and "a float16 running total stalls" in reason


@pytest.mark.parametrize("median", [lambda x: x.float().median().item(), lambda x: statistics.median(x.tolist())])
def test_exercise_00_4_names_a_median_as_a_median_not_a_stalled_total(median):
    reason = exercises.feedback("00.4", median)
    assert reason is not None and "10,000 other" in reason and "their median" in reason and "stalls" not in reason


@pytest.mark.parametrize("typed", [2.3, 2.298])
def test_exercise_00_4_names_a_typed_value_as_one(typed):
    reason = exercises.feedback("00.4", lambda losses: typed)
    assert reason is not None and "whatever the losses" in reason and "stalls" not in reason


NGC_CHECK = """
import torch
m = torch.backends.cuda.matmul
print(torch.get_float32_matmul_precision(), m.allow_tf32)  # NGC's variable: TF32 from the start
torch.set_float32_matmul_precision("highest")
print(torch.get_float32_matmul_precision(), m.allow_tf32)  # undone by the legacy setter
if hasattr(m, "fp32_precision"):
    torch.set_float32_matmul_precision("high")  # NGC's state again, then only the new API
    m.fp32_precision = "ieee"
    try:
        m.allow_tf32
    except RuntimeError:
        print("legacy read refused", torch.get_float32_matmul_precision())
"""


NGC_PART = fresh_part("00 §9: NGC's variable on a CPU", NGC_CHECK, order=90)  # last: it changes TF32 state


def test_ngc_tf32_variable_on_cpu_as_section_9_says(fresh_interpreter):
    """00 §9: under TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 torch starts at "high"; "highest" undoes it; setting
    only the new API to "ieee" makes a legacy allow_tf32 read raise while the precision still says "high"
    (the shared fresh interpreter, started with that variable)."""
    out = fresh_interpreter.parts[NGC_PART].splitlines()
    assert out[:2] == ["high True", "highest False"]
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        assert out[2] == "legacy read refused high"


def test_notebook_00_names_its_machine_first_and_prints_the_rules_advice_without_measuring():
    from tests.support import cells as notebook_cells
    from tests.support import notebook, source

    cells = notebook_cells(notebook("00"))
    sources = [source(c) for c in cells]
    code = [s for c, s in zip(cells, sources) if c["cell_type"] == "code"]
    assert "print(helpers.machine_stamp(device))" in code[0]
    section_1 = next(i for i, text in enumerate(sources) if text.startswith("## 1."))
    verdict = sources[section_1 + 1]
    assert "helpers.choose_precision(description)" in verdict and "describe_device(device)" in verdict
    assert not any(word in verdict for word in ("timing", "compare", "fastest", "speed_profile"))
    outputs = "".join("".join(o.get("text", "")) for o in cells[section_1 + 1].get("outputs", []))
    assert 3 <= len(outputs.splitlines()) <= 8  # a few plain lines: the first screen


def test_stop_1_ends_with_its_recap_and_section_5_needs_no_fp8_layout():
    import re

    from tests.support import cells, notebook, source

    sources = [source(c) for c in cells(notebook("00"))]
    start = next(i for i, s in enumerate(sources) if s.startswith("## 5."))
    end = next(i for i, s in enumerate(sources) if s.startswith("## 6."))
    section_5 = "\n".join(sources[start:end])
    assert not re.search(r"e4m3|e5m2|mantissa|exponent field|bit pattern|ulp|binade|subnormal", section_5)
    recap = sources[end - 1]
    assert recap.startswith("**Recap of this stop.**") and len(recap.split()) <= 80
    assert "Section 1" in recap and "Section 5" in recap


def test_section_10_names_the_scale_dtype_of_each_fp8_recipe():
    from tests.support import cells, notebook, source

    sources = [source(c) for c in cells(notebook("00"))]
    finding = next(s for s in sources if s.startswith("**Finding.** The median relative error of e4m3"))
    text = " ".join(finding.split())
    for words in ("per-tensor and per-row scales", "block of 128 values", "are float32", "one e8m0 scale",
                  "per 32 elements", "e4m3 scale per 16 elements plus a float32 scale per tensor"):
        assert words in text, words
