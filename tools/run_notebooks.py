"""Re-execute notebooks in place, as they are committed: ``python -m tools.run_notebooks [NOTEBOOK ...]``.

Each notebook runs top to bottom in a fresh kernel started in ``notebooks/`` (as nbval does). Tracebacks of the
errors a cell demonstrates on purpose are cut to their last line, because their frames name files of this
machine (nbval does not compare tracebacks). Unexpected errors and stderr output are reported. With no
argument, every numbered notebook is run, in order.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
ERROR_TAGS = {"raises-exception", "nbval-raises-exception"}  # nbval's cell tags for an expected error


def expects_error(cell: dict) -> bool:
    """True for a cell tagged to demonstrate an error (nbval's ``raises-exception`` cell tag)."""
    return bool(ERROR_TAGS & set(cell.get("metadata", {}).get("tags", [])))


def output_problems(cells) -> list[str]:
    """Unexpected errors (in cells not tagged to raise) and stderr outputs of executed ``cells``."""
    problems = []
    for index, cell in enumerate(cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error" and not expects_error(cell):
                problems.append(f"cell {index}: unexpected {output['ename']}: {output['evalue']}")
            if output.get("name") == "stderr":
                problems.append(f"cell {index}: stderr output: {output['text'][:200]}")
    return problems


def run_notebook(path: Path) -> list[str]:
    """Execute ``path`` in place; return the problems found (unexpected errors, stderr output)."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)  # timestamps of an earlier run: noise in diffs
    NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True, record_timing=False,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    problems = output_problems(nb.cells)
    for index, cell in enumerate(nb.cells):
        cell.id = f"cell-{index}"  # stable ids keep diffs small
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                output["traceback"] = [f"\x1b[0;31m{output['ename']}\x1b[0m: {output['evalue']}"]
    nbformat.write(nb, path)
    return problems


def main(argv: list[str] | None = None) -> int:
    paths = [Path(arg) for arg in (argv if argv is not None else sys.argv[1:])]
    paths = paths or sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
    failed = False
    for path in paths:
        start = time.perf_counter()
        problems = run_notebook(path.resolve())
        print(f"{path.name}: {time.perf_counter() - start:.1f} s" + ("" if problems else ", clean"))
        for problem in problems:
            print("  " + problem)
        failed = failed or bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
