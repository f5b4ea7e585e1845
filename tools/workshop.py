"""The 3-hour workshop: its route, its class-time model, and a run of each stop as listed.

    python -m tools.workshop            # the route with each stop's class minutes (the README's table)
    python -m tools.workshop --run      # execute every stop as listed, each in a fresh kernel
    python -m tools.workshop --run 02   # one stop

**A stop** is one notebook's intro cells (everything before its first ``## `` section), the parts the route
lists (section numbers, "The recipe", "Exercise NN.k"), and its ``## Summary`` table as the recap, executed in
that order from a fresh kernel. It must run without any section the route skips: :func:`run_stop` checks that.

**Class time** is not reading time. A class also presents, runs cells together, reads their outputs, takes
questions and switches notebooks. The model adds two terms to the self-study reading time of
``tools.course_stats`` (200 words a minute, 10 s per code line, 7 min per exercise):

- :data:`SWITCH_MINUTES` per stop (open the notebook, restart the kernel, say where we are);
- :data:`OUTPUT_MINUTES` per code cell that shows an output (run it together, read it, a question).

Calibrated on an experienced instructor's stop-by-stop estimate of the earlier route (issue 29: 00 50 min,
02 23, 03 39, 04 30, 05 13, 06 29, 07 9; 193 min for those stops): the least-squares fit of these two terms
gives 2.3 min per stop and 0.71 min per output cell (total 193 min, largest error 6 min, at stop 00); the
model rounds them to 2 and 0.7. :data:`ONBOARDING_MINUTES` (start and wrap-up, the instructor's 10) and the
breaks come on top; the whole must fit :data:`WORKSHOP_MINUTES`.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tools.course_stats import _labelled_cells, notebook_path, rounded_minutes, section_stats

SWITCH_MINUTES = 2.0
OUTPUT_MINUTES = 0.7
ONBOARDING_MINUTES = 10
BREAKS = (10, 10)  # minutes: after stops 3 and 5
WORKSHOP_MINUTES = 180
RECIPE_NOTEBOOK = "07"  # the route ends on its take-home recipe

# (notebook prefix, parts, what the instructor does there). The intro cells and the Summary are always run.
ROUTE: list[tuple[str, tuple[str, ...], str]] = [
    ("00", ("1", "5"), "what this machine runs fast; what float16 and bfloat16 can hold"),
    ("01", ("1", "2", "3"), "`.half()` deployment: what converts, the dtype error, accuracy"),
    ("02", ("2", "4"), "tensors made in `forward`: the error, then `new_zeros`/`new_full` and buffers"),
    ("03", ("The recipe", "1", "2"), "the autocast loop; float32 master weights; what autocast changes"),
    ("04", ("1", "2", "4", "5"), "the GradScaler loop, underflow, skipped steps, `unscale_` first"),
    ("05", ("2", "5"), "autocast is per thread: the `DataParallel` pitfall and its fix"),
    ("07", ("6",), "the take-home recipe and its don'ts"),
]
NEXT_STEPS = ("00 §2 (your roofline) and §8 (16-bit sums), 02 §5 (masks), 03 §3 (op dtypes), "
              "06 (deployment, fact-checked), 08 (transformers), 09 (is it faster?)")


@dataclass(frozen=True)
class Stop:
    notebook: str
    parts: tuple[str, ...]
    focus: str
    reading: float  # self-study minutes of the cells run (tools.course_stats)
    outputs: int  # code cells that show an output

    @property
    def minutes(self) -> float:
        return self.reading + SWITCH_MINUTES + OUTPUT_MINUTES * self.outputs


def stop_indices(prefix: str, parts: tuple[str, ...]) -> list[int]:
    """The indices of a stop's cells, in notebook order: intro, the listed parts, the Summary."""
    wanted = {"intro", "Summary", *parts}
    labelled = _labelled_cells(notebook_path(prefix))
    missing = set(parts) - {label for label, _ in labelled}
    if missing:
        raise ValueError(f"notebook {prefix} has no part(s) {sorted(missing)}")
    return [index for index, (label, _) in enumerate(labelled) if label in wanted]


def stops(route: list[tuple[str, tuple[str, ...], str]] = ROUTE) -> list[Stop]:
    result = []
    for prefix, parts, focus in route:
        sections = section_stats(notebook_path(prefix))
        cells = [c for _, c in _labelled_cells(notebook_path(prefix))]
        outputs = sum(1 for i in stop_indices(prefix, parts)
                      if cells[i]["cell_type"] == "code" and cells[i].get("outputs"))
        reading = sum(sections[p].minutes for p in ("intro", "Summary", *parts) if p in sections)
        result.append(Stop(notebook_path(prefix).name, parts, focus, reading, outputs))
    return result


def total_minutes(route_stops: list[Stop]) -> float:
    return sum(s.minutes for s in route_stops) + ONBOARDING_MINUTES + sum(BREAKS)


def route_markdown(route: list[tuple[str, tuple[str, ...], str]] = ROUTE) -> str:
    """The route as a markdown table: class minutes per stop and the running total."""
    rows = ["| # | Notebook | Sections (§) | Focus | Class minutes | Running total |",
            "|---|---|---|---|---|---|", f"| | | | start: install check, the plan | "
            f"{ONBOARDING_MINUTES} | {ONBOARDING_MINUTES} |"]
    total = float(ONBOARDING_MINUTES)
    for index, stop in enumerate(stops(route), start=1):
        total += stop.minutes
        rows.append(f"| {index} | [{stop.notebook[:2]}](notebooks/{stop.notebook}) | intro, "
                    f"{', '.join(stop.parts)}, Summary | {stop.focus} | "
                    f"{rounded_minutes(stop.minutes, 1)} | {rounded_minutes(total, 1)} |")
        if index in (3, 5):
            total += BREAKS[index // 3 - 1]
            rows.append(f"| | | | break | {BREAKS[index // 3 - 1]} | {rounded_minutes(total, 1)} |")
    return "\n".join(rows)


def run_stop(prefix: str, parts: tuple[str, ...], timeout: int = 300) -> list[str]:
    """Execute one stop from a fresh kernel; return the unexpected errors (cells tagged
    ``raises-exception`` may raise) and stderr outputs."""
    import nbformat
    from nbclient import NotebookClient

    from tools.run_notebooks import output_problems

    path = notebook_path(prefix)
    nb = nbformat.read(path, as_version=4)
    nb.cells = [nb.cells[index] for index in stop_indices(prefix, parts)]
    NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return [f"{path.name}, stop {problem}" for problem in output_problems(nb.cells)]


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if not args or args[0] != "--run":
        print(route_markdown())
        print(f"\nIn all: {rounded_minutes(total_minutes(stops()), 1)} of {WORKSHOP_MINUTES} min "
              f"(breaks {' + '.join(map(str, BREAKS))}). Next steps: {NEXT_STEPS}.")
        return 0
    wanted = set(args[1:])
    failed = False
    for prefix, parts, _ in ROUTE:
        if wanted and prefix not in wanted:
            continue
        start = time.perf_counter()
        problems = run_stop(prefix, parts)
        print(f"stop {prefix} ({', '.join(parts)}): {time.perf_counter() - start:.1f} s, "
              + ("ran as listed" if not problems else "FAILED"))
        for problem in problems:
            print("  " + problem)
        failed = failed or bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
