"""The one copy rule: code a notebook shows that also lives in ``helpers/`` is a marked copy, checked here.

A notebook cell that types a helper again carries the line ``# copy of helpers.<module>: name1, name2``; each
listed top-level definition (``def``, ``class`` or ``NAME = ...``) must be AST-equal, docstrings included, to the
one of that name in ``helpers/<module>.py``. The take-home recipe's copy of the rule is not typed by hand: this
command writes ``helpers/precision.py`` (all but its docstring and imports) between the recipe's lines
``# >>> copy of helpers.precision (python -m tools.copies --write)`` and ``# <<< end of copy``.

    python -m tools.copies            # check every marked copy and the recipe; exit 1 with what drifted
    python -m tools.copies --write    # write the rule into the recipe again, then check

``tests/test_copies.py`` runs the check, so a drifted copy fails the tests.
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
RECIPE = NOTEBOOK_DIR / "take_home_recipe.py"
RULE = ROOT / "helpers" / "precision.py"
BEGIN = "# >>> copy of helpers.precision (python -m tools.copies --write)"
END = "# <<< end of copy"
MARKER = re.compile(r"^# copy of helpers\.([\w.]+): (.+)$", re.MULTILINE)


class Copy(NamedTuple):
    where: str  # "01_half_precision_inference.ipynb, code cell 15"
    module: str  # "timing" (helpers.timing)
    names: tuple[str, ...]  # the definitions the marker lists
    source: str  # the cell's code


def _without_magics(text: str) -> str:
    """``text`` with IPython's ``%magic`` and ``!shell`` lines blanked (not Python)."""
    lines = text.splitlines()
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in lines)


def top_level(source: str) -> dict[str, ast.AST]:
    """The top-level functions, classes and ``NAME = ...`` assignments of ``source``, by name."""
    found = {}
    for node in ast.parse(_without_magics(source)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(targets) == 1 and isinstance(targets[0], ast.Name):
                found[targets[0].id] = node
    return found


def code_cells(path: Path) -> list[str]:
    """The source of every code cell of the notebook at ``path``."""
    cells = json.loads(path.read_text())["cells"]
    texts = [cell["source"] for cell in cells if cell["cell_type"] == "code"]
    return [text if isinstance(text, str) else "".join(text) for text in texts]


def marked_copies(notebook_dir: Path = NOTEBOOK_DIR) -> list[Copy]:
    """Every ``# copy of helpers.<module>: names`` line in the notebooks' code cells."""
    copies = []
    for path in sorted(notebook_dir.glob("*.ipynb")):
        for number, text in enumerate(code_cells(path)):
            for module, names in MARKER.findall(text):
                listed = tuple(name.strip() for name in names.split(","))
                copies.append(Copy(f"{path.name}, code cell {number}", module, listed, text))
    return copies


def module_source(module: str) -> str:
    """The text of ``helpers/<module>.py`` (``module`` may be dotted: ``solutions.nb03``)."""
    return (ROOT / "helpers" / (module.replace(".", "/") + ".py")).read_text()


def drift(copy: Copy, original: str | None = None) -> list[str]:
    """What differs between a marked copy and its original (``original``: the module's text); [] if nothing."""
    original = module_source(copy.module) if original is None else original
    typed, kept = top_level(copy.source), top_level(original)
    problems = []
    for name in copy.names:
        if name not in typed:
            problems.append(f"{copy.where}: marked {name!r} but the cell does not define it")
        elif name not in kept:
            problems.append(f"{copy.where}: helpers.{copy.module} has no {name!r}")
        elif ast.dump(typed[name]) != ast.dump(kept[name]):
            problems.append(f"{copy.where}: {name} differs from helpers.{copy.module}.{name}")
    return problems


def rule_text(rule: str) -> str:
    """``helpers/precision.py`` from its first definition to its end (its docstring and imports are left out)."""
    nodes = ast.parse(rule).body
    first = next(node for node in nodes
                 if not isinstance(node, (ast.Import, ast.ImportFrom))
                 and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)))
    return "".join(rule.splitlines(keepends=True)[first.lineno - 1:])


def written_recipe(recipe: str, rule: str) -> str:
    """The recipe's text with the rule written between its :data:`BEGIN` and :data:`END` lines."""
    start = recipe.index(BEGIN) + len(BEGIN) + 1
    end = recipe.index(END, start)
    return recipe[:start] + rule_text(rule) + "\n\n" + recipe[end:]


def recipe_problems(recipe: str, rule: str) -> list[str]:
    """Why the recipe's copy of the rule is not current ([] if it is)."""
    if BEGIN not in recipe or END not in recipe:
        return [f"{RECIPE.name}: no {BEGIN!r} ... {END!r} region"]
    problems = []
    if written_recipe(recipe, rule) != recipe:
        problems.append(f"{RECIPE.name}: the rule differs from helpers/precision.py (python -m tools.copies --write)")
    imports = {ast.dump(node) for node in ast.parse(rule).body if isinstance(node, (ast.Import, ast.ImportFrom))}
    has = {ast.dump(node) for node in ast.parse(recipe).body if isinstance(node, (ast.Import, ast.ImportFrom))}
    for missing in sorted(imports - has):
        problems.append(f"{RECIPE.name}: the rule needs an import the recipe lacks: {missing}")
    return problems


def helpers_definitions() -> dict[str, list[tuple[str, str]]]:
    """``{name: [(module, ast dump), ...]}`` of every top-level function and class in ``helpers/`` (solutions
    included)."""
    found = {}
    for path in sorted((ROOT / "helpers").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT / "helpers").with_suffix("").parts)
        for name, node in top_level(path.read_text()).items():
            if not isinstance(node, (ast.Assign, ast.AnnAssign)):
                found.setdefault(name, []).append((module, ast.dump(node)))
    return found


def unmarked_copies(notebook_dir: Path = NOTEBOOK_DIR) -> list[str]:
    """Functions and classes a cell defines exactly as a helper does, without a marker that lists them."""
    kept = helpers_definitions()
    problems = []
    for path in sorted(notebook_dir.glob("*.ipynb")):
        for number, text in enumerate(code_cells(path)):
            marked = {(module, name.strip()) for module, names in MARKER.findall(text) for name in names.split(",")}
            for name, node in top_level(text).items():
                same = [module for module, dump in kept.get(name, [])
                        if dump == ast.dump(node) and (module, name) not in marked]
                problems += [f"{path.name}, code cell {number}: {name} is a copy of helpers.{module}.{name} "
                             f"without '# copy of helpers.{module}: {name}'" for module in same]
    return problems


def problems() -> list[str]:
    """Every drifted or unmarked copy in the notebooks, and a stale recipe."""
    found = [problem for copy in marked_copies() for problem in drift(copy)]
    found += unmarked_copies()
    return found + recipe_problems(RECIPE.read_text(), RULE.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write helpers/precision.py into the recipe")
    args = parser.parse_args(argv)
    if args.write:
        RECIPE.write_text(written_recipe(RECIPE.read_text(), RULE.read_text()))
    found = problems()
    for problem in found:
        print(problem)
    copies = marked_copies()
    names = sum(len(copy.names) for copy in copies)
    print(f"{len(copies)} marked copies ({names} definitions) and the recipe's rule: "
          f"{'current' if not found else f'{len(found)} problems'}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
