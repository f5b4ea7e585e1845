"""The committed notebooks are executed in order, clean, and follow the course's anatomy."""
from __future__ import annotations

import json
import re

import pytest

from tests.support import NOTEBOOK_DIR, cell_containing, cells, definitions, source, tags

NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
MACHINE_PATH = re.compile(r"(/root/|/tmp/|/work/|/home/|/Users/|site-packages|[A-Z]:\\\\)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_nbval_markers_are_cell_tags_not_code(path):
    """nbval reads cell tags; comment markers would clutter the code a learner reads (and JupyterLab's Run All
    only continues past an error in a cell tagged raises-exception)."""
    for i, cell in enumerate(cells(path)):
        if cell["cell_type"] == "code":
            assert "NBVAL_" not in source(cell), f"{path.name} cell {i}: use a cell tag, not an NBVAL_ comment"
            if "raises-exception" in tags(cell):
                assert "nbval-ignore-output" in tags(cell), (
                    f"{path.name} cell {i}: an error cell also needs nbval-ignore-output (error texts change "
                    "between PyTorch releases)")


def test_notebooks_exist():
    assert NOTEBOOKS, "no notebooks found in notebooks/"
    assert NOTEBOOKS[0].name.startswith("00_")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_executed_in_order_from_a_fresh_kernel(path):
    counts = [c["execution_count"] for c in cells(path) if c["cell_type"] == "code"]
    assert counts == list(range(1, len(counts) + 1)), f"{path.name}: re-run it top to bottom from a fresh kernel"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_outputs_are_clean(path):
    for i, cell in enumerate(cells(path)):
        for output in cell.get("outputs", []):
            where = f"{path.name} cell {i}"
            assert output.get("name") != "stderr", f"{where}: stderr output (a warning?)"
            if output["output_type"] == "error":
                assert "raises-exception" in tags(cell), f"{where}: unexpected error (tag it raises-exception?)"
            assert not MACHINE_PATH.search(json.dumps(output)), f"{where}: output shows a path of this machine"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_anatomy(path):
    all_cells = cells(path)
    first = source(all_cells[0])
    prefix = path.name[:2]
    assert re.match(rf"# {prefix} · \S", first), f"{path.name}: first cell must start with '# {prefix} · Title'"
    for needed in ("Why this matters", "Learning goals", "Time estimate"):
        assert needed in first, f"{path.name}: the first cell lacks '{needed}'"
    markdown = [source(c) for c in all_cells if c["cell_type"] == "markdown"]
    summary = [m for m in markdown if m.startswith("## Summary")]
    assert summary and "|" in summary[0], f"{path.name}: needs a '## Summary' cell with a table"
    assert any(m.startswith("## Exercises") for m in markdown), f"{path.name}: needs '## Exercises'"
    code = "\n".join(source(c) for c in all_cells if c["cell_type"] == "code")
    assert re.search(rf"check\(\"{prefix}\.\d+\"", code), f"{path.name}: exercises need check(\"{prefix}.k\", ...)"


@pytest.mark.parametrize("index", range(len(NOTEBOOKS)), ids=lambda i: NOTEBOOKS[i].name)
def test_navigation_links(index):
    path = NOTEBOOKS[index]
    all_cells = cells(path)
    ends = [source(all_cells[0]), source(all_cells[-1])]
    wanted = ["../README.md"]
    if index > 0:
        wanted.append(f"({NOTEBOOKS[index - 1].name})")
    if index < len(NOTEBOOKS) - 1:
        wanted.append(f"({NOTEBOOKS[index + 1].name})")
    for text, where in zip(ends, ("first", "last")):
        for link in wanted:
            assert link in text, f"{path.name}: the {where} cell needs a link {link}"


CELL_LINES = 40  # at most, per code cell (CONTRIBUTING.md says so: checked below)
LINE_CHARACTERS = 100  # at most, per line of a notebook cell


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_code_cells_are_short_and_lines_fit(path):
    """A code cell fits a laptop screen (at most CELL_LINES lines: one experiment, or one function typed in
    full), lines of at most LINE_CHARACTERS characters (two notebooks side by side)."""
    for i, cell in enumerate(cells(path)):
        if cell["cell_type"] == "code":
            lines = source(cell).splitlines()
            assert len(lines) <= CELL_LINES, f"{path.name} cell {i}: {len(lines)} lines (at most {CELL_LINES})"
            long = [line for line in lines if len(line) > LINE_CHARACTERS]
            assert not long, f"{path.name} cell {i}: a line over {LINE_CHARACTERS} characters: {long[0]!r}"


def test_contributing_states_the_limits_these_tests_enforce():
    from pathlib import Path

    guide = " ".join((Path(__file__).resolve().parent.parent / "CONTRIBUTING.md").read_text().split())
    assert f"Code cells of at most {CELL_LINES} lines" in guide
    assert f"lines of at most {LINE_CHARACTERS} characters in notebooks" in guide


def test_the_cell_loader_runs_only_the_definitions_asked_for():
    """tests.support.definitions runs a notebook's def statements alone (not the rest of their cells), and a name
    the notebook does not define, or a needle in several cells, is an error rather than a silent pass."""
    import ast

    prefix = NOTEBOOKS[0].name[:2]
    first_code = next(source(c) for c in cells(NOTEBOOKS[0]) if c["cell_type"] == "code")
    assert cell_containing(prefix, first_code) == first_code
    with pytest.raises(LookupError, match="code cells contain"):
        cell_containing(prefix, "")  # every cell contains it
    with pytest.raises(LookupError, match="defines no"):
        definitions(prefix, "no_such_function_in_any_notebook")
    for path in NOTEBOOKS:
        codes = [source(c) for c in cells(path) if c["cell_type"] == "code" and "%" not in source(c)]
        names = [n.name for text in codes for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)]
        if names:
            namespace = {}
            (function,) = definitions(path.name[:2], names[0], namespace=namespace).values()
            assert callable(function) and set(namespace) <= {names[0], "__builtins__"}
            return
    pytest.skip("no notebook defines a function at the top level of a cell")


def _reads_notebook_json(text: str) -> list[int]:
    """Lines of a test file that take a notebook's ``["cells"]`` or call ``nbformat.read`` (the loader's job)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(text)):
        cells_key = isinstance(node, ast.Subscript) and getattr(node.slice, "value", None) == "cells"
        nbformat_read = isinstance(node, ast.Attribute) and node.attr == "read" and \
            getattr(node.value, "id", None) == "nbformat"
        if cells_key or nbformat_read:
            found.append(node.lineno)
    return found


def test_every_test_reads_notebooks_through_the_one_loader():
    """Only tests/support.py parses notebook JSON; a test that reads ``["cells"]`` itself is a second loader."""
    from pathlib import Path

    assert _reads_notebook_json('cells = json.loads(path.read_text())["cells"]') == [1]
    assert _reads_notebook_json('nb = nbformat.read(path, 4)') == [1]
    tests = Path(__file__).resolve().parent
    readers = {path.name: _reads_notebook_json(path.read_text()) for path in sorted(tests.glob("*.py"))
               if path.name != "support.py"}
    assert {name: lines for name, lines in readers.items() if lines} == {}
