"""tools.repeat_ratios reads the ratios the notebooks print with the course's paired method."""
import nbformat

from tools import repeat_ratios


def test_printed_ratios_and_their_summary_over_runs():
    cell = nbformat.v4.new_code_cell("")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=(
        "bf16 prefill: 2.24x (faster; rounds 2.02-2.63x, 2 threads)\nnot a ratio\n"
        "fp16 decode: 0.95x (no clear difference; rounds 0.80-1.10x, 2 threads)\n"))]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("x"), cell])
    found = repeat_ratios.printed_ratios(notebook)
    assert list(found) == ["cell 1.0", "cell 1.1"] and found["cell 1.0"].startswith("bf16 prefill")
    runs = [found["cell 1.0"], "bf16 prefill: 1.90x (faster; rounds 1.80-2.00x, 2 threads)",
            "bf16 prefill: 1.00x (no clear difference; rounds 0.70-1.40x, 2 threads)"]
    assert repeat_ratios.summary(runs) == "bf16 prefill: 1.90x (runs 1.00-2.24x; faster, no clear difference)"
