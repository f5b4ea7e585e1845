"""Write the generated modules of ``helpers/`` from the notebooks' export cells (d2l's way: one source).

A code cell tagged ``export`` (a cell tag, like nbval's) holds only imports, constants and definitions, and names
its module in its metadata: ``{"tags": ["export"], "module": "timing"}``. This command gathers every such cell, in
notebook and cell order, into ``helpers/<module>.py``: a first line saying it is generated and from where, the
module's docstring from :data:`MODULES`, the cells' imports (each once), then the cells' text as written, with
"Defined in NN §k." added to each function's and class's docstring (a comment above a constant). The take-home
recipe's rule block is written from the ``precision`` cells the same way.

    python -m tools.export            # write every generated module (and the recipe's rule block)
    python -m tools.export --check    # exit 1 if a committed generated file differs from a fresh build

Never edit a generated file: edit the cell, run this, re-execute that notebook and every notebook importing the
module (CONTRIBUTING). ``tests/test_export.py`` fails when a committed file is stale.
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
HELPERS = ROOT / "helpers"
RECIPE = NOTEBOOK_DIR / "take_home_recipe.py"
HEADER = "# Generated from"
RECIPE_BEGIN = "# >>> generated from 07 §1 by `python -m tools.export`: edit the cells there, not these lines"
RECIPE_END = "# <<< end of generated"

MODULES = {  # module -> its docstring; a cell naming another module is an error
    "formats": "The number formats' bits, spacing and range (notebook 00).",
    "roofs": "This machine's roofs, measured, and each kernel's place under them (notebook 00 §2).",
    "timing": "The course's one timing method: paired, interleaved rounds and their verdict (notebook 01 §4).",
    "leaks": "Finding tensors that do not follow the input's dtype or device (notebook 02).",
    "training": "The autocast training step and loop, with and without a GradScaler (notebooks 03 and 04).",
    "parallel": "Autocast in threads, DataParallel re-enacted, and data-parallel measurements (notebook 05).",
    "deploy": "Serving a model in half precision: the corrected recipe and its measurements (notebook 06).",
    "precision": "Which precision to use, by rule: what the hardware reports decides (notebook 07 §1).",
    "debugging": "Finding the first non-finite module and op (notebook 07).",
    "gpt": "The course's small GPT, its KV cache and greedy decoding (notebook 08).",
    "fp8": "fp8 and MX block scaling, and an fp8 linear layer (notebook 10).",
    "lowbit": "Weight-only int8 and int4: quantising, packing and the matmuls (notebook 11).",
}
ALLOWED = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign,
           ast.AnnAssign)
SECTION = re.compile(r"^#{2,3} (?:(\d+)\.|(A\.\d+)|(.+))", re.MULTILINE)


class Cell(NamedTuple):
    notebook: str  # "07"
    section: str  # "§1", "A.2" or a heading's words
    module: str  # "precision"
    source: str  # the cell's text as written


def cell_text(cell: dict) -> str:
    source = cell["source"]
    return source if isinstance(source, str) else "".join(source)


def section_of(markdown: str) -> str | None:
    """The last section a markdown cell opens ("§4", "A.2", "the model"), or None."""
    found = None
    for number, appendix, words in SECTION.findall(markdown):
        found = f"§{number}" if number else appendix or words.strip().strip("`").lower()
    return found


def export_cells(notebook_dir: Path = NOTEBOOK_DIR) -> list[Cell]:
    """Every export cell of the numbered notebooks, in order."""
    cells = []
    for path in sorted(notebook_dir.glob("[0-9][0-9]_*.ipynb")):
        section = "intro"
        for cell in json.loads(path.read_text())["cells"]:
            text = cell_text(cell)
            if cell["cell_type"] == "markdown":
                section = section_of(text) or section
            elif "export" in cell.get("metadata", {}).get("tags", []):
                module = cell["metadata"].get("module")
                if module not in MODULES:
                    raise SystemExit(f"{path.name}, {section}: an export cell names module {module!r}; "
                                     f"known: {', '.join(MODULES)} (tools/export.py)")
                cells.append(Cell(path.name[:2], section, module, text))
    return cells


def check_cell(cell: Cell) -> list[ast.stmt]:
    """The cell's top-level statements; an error if it holds anything but imports, constants and definitions."""
    where = f"{cell.notebook} {cell.section} (module {cell.module})"
    if any(line.lstrip().startswith(("%", "!")) for line in cell.source.splitlines()):
        raise SystemExit(f"{where}: an export cell holds an IPython magic")
    nodes = ast.parse(cell.source).body
    for node in nodes:
        if not isinstance(node, ALLOWED):
            raise SystemExit(f"{where}, line {node.lineno}: an export cell holds only imports, constants and "
                             "definitions; move demonstrations and asserts to the next cell")
        if isinstance(node, ast.Assign) and not all(isinstance(target, ast.Name) for target in node.targets):
            raise SystemExit(f"{where}, line {node.lineno}: assign constants to plain names only")
    return nodes


def stamped(lines: list[str], node: ast.stmt, stamp: str) -> None:
    """Add ``stamp`` to the docstring of ``node`` in ``lines`` (a list of the cell's lines, edited in place)."""
    body = node.body
    has_doc = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
        and isinstance(body[0].value.value, str)
    indent = " " * body[0].col_offset
    if body[0].lineno == node.lineno:
        raise SystemExit(f"{node.name}: put the body of an exported definition on its own lines")
    if not has_doc:
        lines.insert(body[0].lineno - 1, f'{indent}"""{stamp}"""\n')
        return
    end = body[0].end_lineno - 1
    line = lines[end]
    close = line.rstrip("\n")
    quotes = close[-3:]
    if close.strip() == quotes:  # the closing quotes on their own line
        lines.insert(end, f"{indent}{stamp}\n")
    else:
        lines[end] = f"{close[:-3]}\n\n{indent}{stamp}\n{indent}{quotes}\n"


def definitions_text(cell: Cell, nodes: list[ast.stmt]) -> tuple[list[str], str]:
    """The cell's import statements (as written) and the rest of its text, stamped with where it is defined."""
    stamp = f"Defined in {cell.notebook} {cell.section}."
    lines = cell.source.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    imports = []
    for node in reversed(nodes):  # from the bottom, so line numbers above stay right
        first = (node.decorator_list[0].lineno if getattr(node, "decorator_list", None) else node.lineno) - 1
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.insert(0, "".join(lines[first:node.end_lineno]).rstrip())
            del lines[first:node.end_lineno]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stamped(lines, node, stamp)
        else:
            lines.insert(first, f"# {stamp}\n")
    return imports, "".join(lines).strip("\n")


def module_text(module: str, cells: list[Cell]) -> str:
    """The generated ``helpers/<module>.py`` from its export cells."""
    places = []
    for cell in cells:
        place = f"{cell.notebook} {cell.section}"
        if place not in places:
            places.append(place)
    imports, bodies = [], []
    for cell in cells:
        cell_imports, body = definitions_text(cell, check_cell(cell))
        imports += [statement for statement in cell_imports if statement not in imports]
        if body:
            bodies.append(body)
    future = [statement for statement in imports if statement.startswith("from __future__")]
    rest = [statement for statement in imports if statement not in future]
    header = (f"{HEADER} notebooks {', '.join(places)} by `python -m tools.export`: do not edit; edit the cells, "
              "then rebuild.\n# ruff: noqa: I001 (imports in the cells' order)\n")
    parts = [header + f'"""{MODULES[module]}"""', "\n".join(future + rest)] + bodies
    return "\n\n\n".join(part for part in parts if part) + "\n"


def recipe_text(recipe: str, cells: list[Cell]) -> str:
    """The recipe with the precision cells' definitions (no imports) between its marker lines."""
    if RECIPE_BEGIN not in recipe:
        return recipe
    start = recipe.index(RECIPE_BEGIN) + len(RECIPE_BEGIN) + 1
    end = recipe.index(RECIPE_END, start)
    bodies = [definitions_text(cell, check_cell(cell))[1] for cell in cells]
    return recipe[:start] + "\n\n\n".join(body for body in bodies if body) + "\n\n\n" + recipe[end:]


def build(notebook_dir: Path = NOTEBOOK_DIR) -> dict[Path, str]:
    """Every generated file's path and text, as a fresh build writes them."""
    by_module: dict[str, list[Cell]] = {}
    for cell in export_cells(notebook_dir):
        by_module.setdefault(cell.module, []).append(cell)
    files = {HELPERS / f"{module}.py": module_text(module, cells) for module, cells in by_module.items()}
    if "precision" in by_module and RECIPE.exists():
        files[RECIPE] = recipe_text(RECIPE.read_text(), by_module["precision"])
    return files


def stale(files: dict[Path, str]) -> list[str]:
    """The generated files that differ from ``files`` (or are generated but no longer built)."""
    problems = [f"{path.relative_to(ROOT)} differs from a fresh build" for path, text in files.items()
                if not path.exists() or path.read_text() != text]
    for path in sorted(HELPERS.glob("*.py")):
        if path.read_text().startswith(HEADER) and path not in files:
            problems.append(f"{path.relative_to(ROOT)} is generated, but no export cell builds it now")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the committed files are current")
    args = parser.parse_args(argv)
    files = build()
    if not args.check:
        for path, text in files.items():
            path.write_text(text)
    problems = stale(files)
    for problem in problems:
        print(problem)
    print(f"{len(files)} generated files: {'current' if not problems else f'{len(problems)} stale'}"
          + ("" if not problems else " (python -m tools.export)"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
