"""How steady are the notebooks' speed ratios? ``python -m tools.repeat_ratios --runs 5 [NOTEBOOK ...]``.

Executes each notebook ``--runs`` times from a fresh kernel, on a copy in memory (nothing is written back), and
collects every ratio its cells print with the course's paired method (``helpers.timing.Comparison``: "1.45x
(faster; rounds 1.20-1.83x, ...)"). It then prints, per printed line, the lowest and highest of the runs' medians,
their median and the verdicts seen. The ratios come from the cells that teach each workload: this only runs them
again. With no notebook named, it runs the ones that time a workload: 01, 03, 06, 08 and 09.
"""

import argparse
import re
import statistics
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from tools.run_notebooks import output_problems

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
TIMED = ("01_half_precision_inference.ipynb", "03_autocast_training.ipynb", "06_deploying_half_precision.ipynb",
         "08_transformers_in_mixed_precision.ipynb", "09_is_it_faster.ipynb")
RATIO = re.compile(r"(\d+\.\d+)x \((faster|slower|no clear difference); rounds (\d+\.\d+)-(\d+\.\d+)x")


def printed_ratios(notebook) -> dict[str, str]:
    """Each printed line holding a paired ratio, keyed by cell index and its order in the cell."""
    found = {}
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        text = "".join(output.get("text", "") for output in cell.get("outputs", [])
                       if output.get("output_type") == "stream")
        lines = [line.strip() for line in text.splitlines() if RATIO.search(line)]
        for order, line in enumerate(lines):
            found[f"cell {index}.{order}"] = line
    return found


def summary(lines: list[str]) -> str:
    """The runs' medians of one printed line: lowest-highest, their median, and the verdicts seen."""
    matches = [RATIO.search(line) for line in lines]
    ratios = [float(match.group(1)) for match in matches]
    verdicts = sorted({match.group(2) for match in matches})
    label = RATIO.split(lines[0])[0].strip()[:70]
    return (f"{label} {statistics.median(ratios):.2f}x (runs {min(ratios):.2f}-{max(ratios):.2f}x; "
            f"{', '.join(verdicts)})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("notebooks", nargs="*", default=list(TIMED))
    args = parser.parse_args(argv)
    for name in args.notebooks:
        path = NOTEBOOK_DIR / Path(name).name
        collected: dict[str, list[str]] = {}
        for run in range(args.runs):
            notebook = nbformat.read(path, as_version=4)
            start = time.perf_counter()
            client = NotebookClient(notebook, timeout=600, allow_errors=True,  # cells that raise on purpose
                                    resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
            client.execute()
            for problem in output_problems(notebook.cells):  # an unexpected error or stderr: say so
                print(f"{path.name}: run {run + 1}: {problem}")
            for key, line in printed_ratios(notebook).items():
                collected.setdefault(key, []).append(line)
            print(f"{path.name}: run {run + 1} in {time.perf_counter() - start:.1f} s", flush=True)
        for key, lines in collected.items():
            print(f"  {key}: {summary(lines)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
