"""tools.repeat_ratios reads the ratios, intervals, verdicts and rule checks the notebooks print with the
course's paired method, and flags a faster/slower flip and a finding missing from some runs."""
import nbformat

from tools import repeat_ratios

PREFILL = "bf16 prefill: 2.24x (faster; median between 2.02x and 2.63x, 8 rounds, 2 threads, load 1.9)"
DECODE = "fp16 decode: 0.95x (no clear difference; median between 0.80x and 1.10x, 24 rounds, 2 threads, load n/a)"


def notebook_printing(text):
    cell = nbformat.v4.new_code_cell("")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("x"), cell])


def test_printed_ratios_pair_each_ratio_with_the_rule_check_under_it():
    found = repeat_ratios.printed_ratios(notebook_printing(
        f"{PREFILL}\n    finding: disagrees with the rule: expected no gain\nnot a ratio\n{DECODE}\n"))
    assert list(found) == ["cell 1.0", "cell 1.1"]
    assert found["cell 1.0"] == (PREFILL, "finding: disagrees with the rule: expected no gain")
    assert found["cell 1.1"] == (DECODE, None)


def test_summary_lists_each_run_and_flags_nothing_when_steady():
    runs = [(PREFILL, "agrees with the rule: expected faster"),
            ("bf16 prefill: 1.90x (faster; median between 1.80x and 2.00x, 8 rounds, 2 threads, load 2.0)",
             "agrees with the rule: expected faster")]
    assert repeat_ratios.summary(runs) == (
        "bf16 prefill: 2.24x [2.02-2.63] faster, agrees; 1.90x [1.80-2.00] faster, agrees")


def test_summary_flags_a_flip_and_a_finding_in_only_some_runs():
    slower = "bf16 prefill: 0.70x (slower; median between 0.60x and 0.80x, 16 rounds, 2 threads, load 3.0)"
    busy = "bf16 prefill: 1.00x (too busy to tell; median between 0.30x and infx, 24 rounds, 2 threads, load 9.0)"
    runs = [(PREFILL, "finding: disagrees with the rule: expected no gain"),
            (slower, "borderline (interval 0.60-0.80x): the rule expects no gain"), (busy, None)]
    line = repeat_ratios.summary(runs)
    assert "FLIP: faster in some runs, slower in others" in line
    assert "FINDING IN 1 OF 3 RUNS" in line
    assert "1.00x [0.30-inf] too busy to tell, -" in line
    steady = repeat_ratios.summary([(PREFILL, "finding: x"), (PREFILL, "finding: y")])
    assert "<--" not in steady
