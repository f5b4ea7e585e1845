"""How long a notebook takes a learner: ``python -m tools.course_stats``.

A notebook has a **core path** and, optionally, an **appendix**: the appendix starts at the first markdown cell
with a line that begins with ``## Appendix`` and runs to the end (the closing navigation cell aside). Workshops and
first readings take the core path; the appendix holds what is "under the hood".

**Time** is estimated as a learner would spend it, from three counts (calibrated on an instructor's reading of
notebooks 03 and 04, about 100 and 90 minutes):

- prose: markdown words at :data:`WORDS_PER_MINUTE` (careful technical reading);
- code: non-blank code lines at :data:`SECONDS_PER_CODE_LINE` (read it, run it, look at the output);
- exercises: :data:`MINUTES_PER_EXERCISE` for each ``check("NN.k", ...)`` call.

``python -m tools.course_stats --route`` prints the README's self-study route (the 3-hour workshop route and its
class-time model: ``tools/workshop.py``).
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
APPENDIX_PREFIX = "## Appendix"
WORDS_PER_MINUTE = 200
SECONDS_PER_CODE_LINE = 10
MINUTES_PER_EXERCISE = 7
_EXERCISE = re.compile(r"""\bcheck\(\s*["']\d\d\.\d+["']""")


@dataclass
class PartStats:
    """Counts for one part (core or appendix) of a notebook."""

    words: int = 0
    code_lines: int = 0  # non-blank lines, comments included (they are read)
    exercises: int = 0

    @property
    def minutes(self) -> float:
        """Estimated learner time in minutes (see the module docstring)."""
        return (self.words / WORDS_PER_MINUTE + self.code_lines * SECONDS_PER_CODE_LINE / 60
                + self.exercises * MINUTES_PER_EXERCISE)


@dataclass
class NotebookStats:
    name: str
    core: PartStats
    appendix: PartStats


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _add_cell(part: PartStats, cell: dict) -> None:
    text = _source(cell)
    if cell["cell_type"] == "markdown":
        part.words += len(re.findall(r"[A-Za-z0-9][\w'’-]*", text))
    elif cell["cell_type"] == "code":
        part.code_lines += sum(1 for line in text.splitlines() if line.strip())
        part.exercises += len(_EXERCISE.findall(text))


def _labelled_cells(path: Path) -> list[tuple[str, dict]]:
    """Each cell of a notebook with the part it belongs to: "intro" (title and setup), "1", "2"... for a section
    headed ``## 1. ...``, "Summary", "Exercise NN.k" for each exercise, "Appendix", or the heading's text for any
    other ``## `` section. The closing navigation cell is left out."""
    cells = json.loads(path.read_text())["cells"]
    labelled, label = [], "intro"
    for index, cell in enumerate(cells):
        text = _source(cell).lstrip()
        if index == len(cells) - 1 and index > 0 and cell["cell_type"] == "markdown":
            break  # the closing navigation cell
        if cell["cell_type"] == "markdown":
            heading_line = re.search(r"^## (.+)$", text, re.M)
            if label == "Appendix" or re.search(rf"^{APPENDIX_PREFIX}", text, re.M):
                label = "Appendix"
            elif exercise := re.search(r"\*\*Exercise (\d\d\.\d+)", text):
                label = f"Exercise {exercise.group(1)}"
            elif heading_line:
                heading = heading_line.group(1).strip()
                number = re.match(r"(\d+)\.", heading)
                label = number.group(1) if number else heading  # "Summary", "The recipe", ...
        labelled.append((label, cell))
    return labelled


def notebook_stats(path: str | Path) -> NotebookStats:
    """Words, code lines and exercises of a notebook's core path and appendix."""
    path = Path(path)
    core, appendix = PartStats(), PartStats()
    for label, cell in _labelled_cells(path):
        _add_cell(appendix if label == "Appendix" else core, cell)
    return NotebookStats(path.name, core, appendix)


def section_stats(path: str | Path) -> dict[str, PartStats]:
    """The same counts per part of the notebook (see :func:`_labelled_cells` for the labels), in order."""
    sections: dict[str, PartStats] = {}
    for label, cell in _labelled_cells(Path(path)):
        _add_cell(sections.setdefault(label, PartStats()), cell)
    return sections


def rounded_minutes(minutes: float, step: int = 5) -> int:
    """``minutes`` rounded to the nearest ``step`` (at least ``step``, or 0 for none): how an estimate is stated."""
    if minutes <= 0:
        return 0  # no appendix: "+ 0", not a made-up five minutes
    return max(step, int(step * round(minutes / step)))


def time_estimate_text(stats: NotebookStats) -> str:
    """The sentence a notebook's first cell must carry, e.g. 'about 40 minutes for the core path'."""
    text = f"about {rounded_minutes(stats.core.minutes)} minutes for the core path"
    if stats.appendix.words or stats.appendix.code_lines:
        text += f", plus about {rounded_minutes(stats.appendix.minutes)} for the appendix"
    return text


def notebook_path(prefix: str) -> Path:
    """The notebook whose file name starts with ``prefix`` (e.g. "03")."""
    matches = sorted(NOTEBOOK_DIR.glob(f"{prefix}_*.ipynb"))
    if len(matches) != 1:
        raise ValueError(f"no single notebook starts with {prefix!r}: {matches}")
    return matches[0]


def self_study_markdown() -> str:
    """The README's self-study route: every notebook in order, with the summed core and appendix minutes (the
    course map's rounded figures, summed)."""
    stats = [notebook_stats(p) for p in sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))]
    # the sums of the course map's rounded figures, so that the two agree
    core, appendix = (sum(rounded_minutes(getattr(s, part).minutes) for s in stats) for part in ("core", "appendix"))
    return (f"**Self-study route:** all {len(stats)} notebooks in order, core path then exercises, appendices "
            f"when curious: about {round((core + appendix) / 60)} hours in all (core paths {core} min, "
            f"appendices {appendix} min), best spread over several sittings.")


def table(paths: list[Path]) -> str:
    """A markdown table of every notebook's estimated times and what they are computed from."""
    rows = ["| notebook | core min | appendix min | core words | core code lines | exercises |",
            "|---|---|---|---|---|---|"]
    for path in paths:
        s = notebook_stats(path)
        rows.append(f"| {s.name} | {s.core.minutes:.0f} | {s.appendix.minutes:.0f} | {s.core.words} | "
                    f"{s.core.code_lines} | {s.core.exercises} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if args == ["--route"]:  # the workshop route: python -m tools.workshop
        print(self_study_markdown())
        return 0
    paths = [Path(a) for a in args] or sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
    print(table(paths))
    print(f"\nTime = words / {WORDS_PER_MINUTE} + code lines x {SECONDS_PER_CODE_LINE} s + "
          f"{MINUTES_PER_EXERCISE} min per exercise.")
    for path in paths:
        print(f"{path.name}: **Time estimate:** {time_estimate_text(notebook_stats(path))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
