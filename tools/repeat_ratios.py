"""How steady are the notebooks' speed verdicts? ``python -m tools.repeat_ratios --runs 5 [NOTEBOOK ...]``.

Executes each notebook ``--runs`` times from a fresh kernel, on a copy in memory (nothing is written back),
and collects every ratio its cells print with the course's paired method (``helpers.timing.Comparison``:
"1.45x (faster; median between 1.20x and 1.83x, 8 rounds, ...)") and the rule check printed under it
(``helpers.timing.against_rule``: "agrees with the rule ...", "borderline (...)", "finding: ..."). It then
prints, per printed line, each run's ratio, interval and verdict, and flags a verdict that flips between
faster and slower across runs and a finding that is not printed in every run. The ratios come from the
cells that teach each workload: this only runs them again. With no notebook named, it runs the ones that
time a workload: 01, 03, 06, 08 and 09.
"""

import argparse
import re
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from tools.run_notebooks import output_problems

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
TIMED = ("00_setup_and_number_formats.ipynb", "01_half_precision_inference.ipynb", "03_autocast_training.ipynb",
         "06_deploying_half_precision.ipynb", "08_transformers_in_mixed_precision.ipynb",
         "09_is_it_faster.ipynb", "11_weight_only_int8_int4.ipynb")
NUMBER = r"(\d+\.\d+|inf)"
RATIO = re.compile(NUMBER + r"x \((faster|slower|no clear difference|too busy to tell); "
                   r"median between " + NUMBER + "x and " + NUMBER + "x")
CHECK = re.compile(r"^(?:-> )?(agrees with the rule|borderline|finding)")


def printed_ratios(notebook) -> dict[str, tuple[str, str | None]]:
    """Each printed line holding a paired ratio, keyed by cell index and its order in the cell, with the
    rule check printed after it (before the next ratio), or None."""
    found = {}
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        text = "".join(output.get("text", "") for output in cell.get("outputs", [])
                       if output.get("output_type") == "stream")
        order = -1
        for line in (line.strip() for line in text.splitlines()):
            if RATIO.search(line):
                order += 1
                found[f"cell {index}.{order}"] = (line, None)
            elif order >= 0 and CHECK.match(line) and found[f"cell {index}.{order}"][1] is None:
                found[f"cell {index}.{order}"] = (found[f"cell {index}.{order}"][0], line)
    return found


def check_word(check: str | None) -> str:
    """"agrees", "borderline", "finding" or "-" (no rule check printed)."""
    if check is None:
        return "-"
    return CHECK.match(check).group(1).split()[0]


def summary(runs: list[tuple[str, str | None]]) -> str:
    """One printed line over the runs: each run's ratio, interval, verdict and rule check, then flags."""
    matches = [RATIO.search(line) for line, _ in runs]
    label = RATIO.split(runs[0][0])[0].strip()[:70]
    each = [f"{m.group(1)}x [{m.group(3)}-{m.group(4)}] {m.group(2)}, {check_word(check)}"
            for m, (_, check) in zip(matches, runs)]
    verdicts = {m.group(2) for m in matches}
    findings = sum(check_word(check) == "finding" for _, check in runs)
    flags = []
    if {"faster", "slower"} <= verdicts:
        flags.append("FLIP: faster in some runs, slower in others")
    if 0 < findings < len(runs):
        flags.append(f"FINDING IN {findings} OF {len(runs)} RUNS")
    return f"{label} " + "; ".join(each) + "".join(f"  <-- {flag}" for flag in flags)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("notebooks", nargs="*", default=list(TIMED))
    args = parser.parse_args(argv)
    for name in args.notebooks:
        path = NOTEBOOK_DIR / Path(name).name
        collected: dict[str, list[tuple[str, str | None]]] = {}
        for run in range(args.runs):
            notebook = nbformat.read(path, as_version=4)
            start = time.perf_counter()
            client = NotebookClient(notebook, timeout=600, allow_errors=True,  # cells that raise on purpose
                                    resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
            client.execute()
            for problem in output_problems(notebook.cells):  # an unexpected error or stderr: say so
                print(f"{path.name}: run {run + 1}: {problem}")
            for key, printed in printed_ratios(notebook).items():
                collected.setdefault(key, []).append(printed)
            print(f"{path.name}: run {run + 1} in {time.perf_counter() - start:.1f} s", flush=True)
        for key, runs in collected.items():
            missing = f" (printed in {len(runs)} of {args.runs} runs)" if len(runs) < args.runs else ""
            print(f"  {key}: {summary(runs)}{missing}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
