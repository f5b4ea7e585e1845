"""The pre-flight report that ends every ``pytest`` run (hooked in by the root ``conftest.py``).

One screen for an instructor checking a classroom machine: the machine (CPU model and 16-bit flags, or the GPU
and its compute capability; torch; threads), the course's advice for it by rule (``helpers.precision``, per
workload shape; nothing is measured for the report), each notebook's own result and time, and for a failure
the notebook and section it belongs to and what it means for the lesson. pytest's own summary line stays last.
``python -m tools.preflight`` prints the machine part alone.
"""
from __future__ import annotations

import re
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Recorder:
    """Seconds and outcomes per group (each notebook, the unit tests), from pytest's reports."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.failed: dict[str, list[str]] = defaultdict(list)
        self.passed: dict[str, int] = defaultdict(int)
        self.start = time.perf_counter()
        import torch

        self.threads = torch.get_num_threads()  # the session's: a test may leave it changed

    def add(self, report) -> None:
        path, _, name = report.nodeid.partition("::")
        group = Path(path).name if path.endswith(".ipynb") else "unit tests"
        self.seconds[group] += report.duration
        if report.failed:
            self.failed[group].append(name if group != "unit tests" else report.nodeid)
        elif report.when == "call" and report.passed:
            self.passed[group] += 1


def cell_section(notebook: str, item: str) -> str:
    """'§3 (Which operations run in which dtype?)' for nbval's item 'Cell 12' (the 13th code cell)."""
    import json

    match = re.match(r"Cell (\d+)", item)
    path = ROOT / "notebooks" / notebook
    if not match or not path.exists():
        return item
    cells = json.loads(path.read_text())["cells"]
    code = [i for i, c in enumerate(cells) if c["cell_type"] == "code"]
    index = code[int(match.group(1))] if int(match.group(1)) < len(code) else None
    if index is None:
        return item
    heading = next((line for c in reversed(cells[: index + 1]) if c["cell_type"] == "markdown"
                    for line in "".join(c["source"]).splitlines() if line.startswith("## ")), None)
    tags = set(cells[index].get("metadata", {}).get("tags", []))
    meaning = ("a claim measured on this machine did not hold (the cell asserts it): the lesson runs, "
               "this machine may show a different result" if "nbval-ignore-output" in tags else
               "the cell fails or prints something else than the committed notebook: learners will "
               "see it")
    return f"{item} (notebook cell {index}), in {heading or 'the intro'}: {meaning}"


def machine_lines(threads: int | None = None) -> list[str]:
    """The machine, and the course's advice for it by rule (helpers.precision: nothing is measured)."""
    import torch

    if threads:
        torch.set_num_threads(threads)

    import helpers

    device = helpers.pick_device()
    lines = [helpers.machine_stamp(device).replace("Outputs made on", "Machine")]
    try:
        advice = helpers.choose_precision(helpers.describe_device(device))
        lines.append("  Advice by rule (07 §1; the notebooks' cells measure it):")
        lines += [f"    {workload:>17}: {a.how}" + (f" {str(a.dtype)[6:]}" if a.dtype else "")
                  + f" ({a.reason})" for workload, a in advice.items()]
    except Exception as error:  # the report never fails the run
        lines.append(f"  (advice unavailable: {type(error).__name__}: {error})")
    if device.type == "cpu" and not torch.cuda.is_available():
        lines.append("  No GPU: the CUDA branches are not run here (they are tested by simulation).")
    return lines


def report_lines(recorder: Recorder) -> list[str]:
    lines = ["", "=" * 30 + " pre-flight report " + "=" * 30]
    lines += machine_lines(recorder.threads)
    lines.append("")
    for group in sorted(recorder.seconds, key=lambda g: (g != "unit tests", g)):
        failures = recorder.failed.get(group, [])
        verdict = "ok" if not failures else f"FAILED ({len(failures)})"
        lines.append(f"  {group:<46} {verdict:<12} {recorder.seconds[group]:6.1f} s")
        for item in failures[:5]:
            where = item if group == "unit tests" else cell_section(group, item)
            lines.append(f"      - {where}")
        if len(failures) > 5:
            lines.append(f"      ... and {len(failures) - 5} more")
    lines.append(f"  {'wall time':<46} {'':<12} {time.perf_counter() - recorder.start:6.1f} s")
    if any(recorder.failed.values()):
        lines.append("  A unit test failure is in the helpers; a notebook failure names its section above.")
    return lines


def main() -> int:
    print("\n".join(machine_lines()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
