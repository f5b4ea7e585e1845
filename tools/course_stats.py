"""How long a notebook takes a learner, and how much of its code teaches: ``python -m tools.course_stats``.

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

**Teaching fraction**: the share of the core path's code lines that are the idea itself or its measurement.
Each top-level statement is classified with :mod:`ast`; its lines count as

- ``show``: printing, plotting and formatting: ``print(...)``, ``display(...)``, calls of functions named
  ``show*``/``print*``/``plot*``, any statement that calls a matplotlib object (``plt``, ``ax``, ``fig``,
  ``axes``), and assignments of a formatted string (an f-string, ``.format``, ``.join``);
- ``measure``: a statement that calls a timing or memory tool (``time_it``, ``Timer``, ``perf_counter``,
  ``synchronize``, the ``*memory*``/``*_bytes`` measurers and the like), or a loop or function that contains
  such a call: the experiment's measurement, which counts towards the teaching fraction (a learner should be
  able to write it in their own project, so it stays in the cell);
- ``check``: ``assert``, ``raise``, and calls of ``check``/``*.check`` (a claim verified, or an exercise graded);
- ``setup``: imports;
- ``teach``: everything else (models, data, the recipe, experiments, a bare expression whose value is shown).

A compound statement (``for``, ``with``, ``if``, a function) counts its header as ``teach`` unless every statement
in its body is of one non-teaching kind, in which case the whole block is that kind. Comment lines, blank lines
and IPython magics count in no kind.
"""
from __future__ import annotations

import ast
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
APPENDIX_PREFIX = "## Appendix"
WORDS_PER_MINUTE = 200
SECONDS_PER_CODE_LINE = 10
MINUTES_PER_EXERCISE = 7
TEACHING_TARGET = 0.60
KINDS = ("teach", "show", "measure", "check", "setup")
_SHOW_NAMES = re.compile(r"^(print|display|show\w*|print\w*|plot\w*)$")
_PLOT_OBJECTS = re.compile(r"^(plt|ax|axes|fig|ax\d|axs)$")
_MEASURE_NAMES = re.compile(r"^(time_it|Timer|blocked_autorange|timeit|perf_counter|monotonic|synchronize|"
                            r"\w*memory\w*|\w*_bytes\w*|reset_peak\w*|benchmark)$")
_CHECK_NAMES = {"check"}
_EXERCISE = re.compile(r"""\bcheck\(\s*["']\d\d\.\d+["']""")


def _call_name(node: ast.AST) -> str | None:
    """The called name of ``f(...)`` or ``obj.f(...)``; None for anything else."""
    if isinstance(node, ast.Expr):
        node = node.value
    if isinstance(node, ast.Await):
        node = node.value
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _called(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def statement_kind(node: ast.stmt) -> str:
    """The kind (one of :data:`KINDS`) of one statement, as described in the module docstring."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return "setup"
    if isinstance(node, (ast.Assert, ast.Raise)):
        return "check"
    name = _call_name(node)
    if name is not None and _SHOW_NAMES.match(name):
        return "show"
    if name in _CHECK_NAMES:
        return "check"
    compound = isinstance(node, (ast.For, ast.While, ast.If, ast.With, ast.Try, ast.FunctionDef, ast.ClassDef))
    if compound and any(_MEASURE_NAMES.match(_called(n)) for n in ast.walk(node) if isinstance(n, ast.Call)):
        return "measure"  # a loop or function that times or measures memory is a harness
    if not compound:
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None and (
                isinstance(node.value, ast.JoinedStr) or _call_name(node.value) in ("format", "join")):
            return "show"
        calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
        for call in calls:
            if _MEASURE_NAMES.match(_called(call)):
                return "measure"
            root = call.func
            while isinstance(root, (ast.Attribute, ast.Call, ast.Subscript)):
                root = root.value if not isinstance(root, ast.Call) else root.func
            if isinstance(root, ast.Name) and _PLOT_OBJECTS.match(root.id):
                return "show"
    body = [s for attr in ("body", "orelse", "finalbody") for s in getattr(node, attr, []) or []]
    if isinstance(node, (ast.For, ast.While, ast.If, ast.With, ast.Try)) and body:
        kinds = {statement_kind(s) for s in body if not isinstance(s, ast.Pass)}
        if len(kinds) == 1 and "teach" not in kinds:
            return kinds.pop()
    return "teach"


def _line_kinds(statements: list[ast.stmt], kinds: dict[int, str]) -> None:
    """Assign a kind to every line of ``statements``; compound 'teach' statements are split by their body."""
    for node in statements:
        kind = statement_kind(node)
        body = getattr(node, "body", None)
        compound = isinstance(body, list) and body and isinstance(body[0], ast.stmt)
        if kind == "teach" and compound and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                   ast.ClassDef)):
            for line in range(node.lineno, body[0].lineno):
                kinds[line] = "teach"
            for attr in ("body", "orelse", "finalbody", "handlers"):
                children = getattr(node, attr, []) or []
                if attr == "handlers":
                    for handler in children:
                        kinds[handler.lineno] = "teach"
                        _line_kinds(handler.body, kinds)
                else:
                    _line_kinds(children, kinds)
        elif kind == "teach" and compound:  # a function or class: split its body the same way
            for line in range(node.lineno, body[0].lineno):
                kinds[line] = "teach"
            _line_kinds(body, kinds)
        else:
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                kinds[line] = kind


def code_line_kinds(source: str) -> dict[str, int]:
    """Count the code lines of one cell by kind (comments, blank lines and magics are not counted)."""
    lines = source.splitlines()
    cleaned = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in lines)
    counts = dict.fromkeys(KINDS, 0)
    try:
        tree = ast.parse(cleaned)
    except SyntaxError:  # not Python: count every non-blank line as teaching
        counts["teach"] = sum(1 for line in lines if line.strip() and not line.lstrip().startswith("#"))
        return counts
    kinds: dict[int, str] = {}
    _line_kinds(tree.body, kinds)
    for number, line in enumerate(cleaned.splitlines(), start=1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and number in kinds:
            counts[kinds[number]] += 1
    return counts


@dataclass
class PartStats:
    """Counts for one part (core or appendix) of a notebook."""

    words: int = 0
    code_lines: int = 0  # non-blank lines, comments included (they are read)
    exercises: int = 0
    kinds: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))

    @property
    def minutes(self) -> float:
        """Estimated learner time in minutes (see the module docstring)."""
        return (self.words / WORDS_PER_MINUTE + self.code_lines * SECONDS_PER_CODE_LINE / 60
                + self.exercises * MINUTES_PER_EXERCISE)

    @property
    def teaching_fraction(self) -> float:
        """Share of classified code lines that teach (0.0 when there is no code): ``teach`` and ``measure`` lines,
        since in a course by experiment the measurement a learner should be able to write is part of the lesson."""
        total = sum(self.kinds.values())
        return (self.kinds["teach"] + self.kinds["measure"]) / total if total else 0.0


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
        for kind, count in code_line_kinds(text).items():
            part.kinds[kind] += count


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
    """Words, code lines, exercises and line kinds of a notebook's core path and appendix."""
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
    """``minutes`` rounded to the nearest ``step`` (at least ``step``): how a time estimate is stated."""
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
    """The README's self-study route: every notebook in order, with the summed core and appendix minutes."""
    stats = [notebook_stats(p) for p in sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))]
    core, appendix = (round(sum(getattr(s, part).minutes for s in stats)) for part in ("core", "appendix"))
    return (f"**Self-study route:** all {len(stats)} notebooks in order, core path then exercises, appendices "
            f"when curious: about {round((core + appendix) / 60)} hours in all (core paths {core} min, "
            f"appendices {appendix} min), best spread over several sittings.")


def table(paths: list[Path]) -> str:
    """A markdown table of every notebook's estimated times and core teaching fraction."""
    rows = ["| notebook | core min | appendix min | core words | core code lines | exercises | core teaching |",
            "|---|---|---|---|---|---|---|"]
    for path in paths:
        s = notebook_stats(path)
        rows.append(f"| {s.name} | {s.core.minutes:.0f} | {s.appendix.minutes:.0f} | {s.core.words} | "
                    f"{s.core.code_lines} | {s.core.exercises} | {s.core.teaching_fraction:.0%} "
                    f"({s.core.kinds['teach'] + s.core.kinds['measure']}/{sum(s.core.kinds.values())}) |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if args == ["--route"]:  # the workshop route: python -m tools.workshop
        print(self_study_markdown())
        return 0
    paths = [Path(a) for a in args] or sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
    print(table(paths))
    print(f"\nTime = words / {WORDS_PER_MINUTE} + code lines x {SECONDS_PER_CODE_LINE} s + "
          f"{MINUTES_PER_EXERCISE} min per exercise. Target: core teaching >= {TEACHING_TARGET:.0%}.")
    for path in paths:
        print(f"{path.name}: **Time estimate:** {time_estimate_text(notebook_stats(path))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
