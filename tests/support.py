"""Test support: read a notebook's cells, and run what a cell defines, exactly as a learner is given it.

    from tests.support import cell_containing, code_cells, definitions, notebook

    source = cell_containing("07", "scaler.state_dict()")    # the one code cell with that text
    (train_step,) = definitions("04", "train_step", namespace={"torch": torch}).values()

One loader for every test that reads notebooks (the notebook tests used to carry a copy each).
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"


def notebook(prefix: str) -> Path:
    """The notebook whose file name starts with ``prefix`` ("03" or "03_autocast")."""
    matches = sorted(NOTEBOOK_DIR.glob(f"{prefix}*.ipynb"))
    if len(matches) != 1:
        raise LookupError(f"expected one notebook starting with {prefix!r}, found {[p.name for p in matches]}")
    return matches[0]


def cells(path: Path) -> list[dict]:
    """Every cell of the notebook at ``path``, as nbformat stores it."""
    return json.loads(Path(path).read_text())["cells"]


def source(cell: dict) -> str:
    """A cell's text (nbformat stores it as a list of lines or as one string)."""
    text = cell.get("source", "")
    if isinstance(text, list):
        return "".join(text)
    return text


def text(path: Path) -> str:
    """The prose and code of every cell of the notebook at ``path`` (not its outputs), cells apart by a blank line."""
    return "\n\n".join(source(cell) for cell in cells(path))


def tags(cell: dict) -> set[str]:
    """A cell's tags (nbval-ignore-output, raises-exception, ...)."""
    return set(cell.get("metadata", {}).get("tags", []))


def code_cells(prefix: str) -> list[str]:
    """The source of every code cell of a notebook, in order."""
    return [source(cell) for cell in cells(notebook(prefix)) if cell["cell_type"] == "code"]


def cell_containing(prefix: str, needle: str) -> str:
    """The source of the one code cell of a notebook that contains ``needle`` (an error if none or several)."""
    matching = [text for text in code_cells(prefix) if needle in text]
    if len(matching) != 1:
        raise LookupError(f"notebook {prefix}: {len(matching)} code cells contain {needle!r}, expected one")
    return matching[0]


def _without_magics(text: str) -> str:
    """``text`` with IPython's ``%magic`` and ``!shell`` lines blanked (not Python; line numbers kept)."""
    lines = text.splitlines()
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in lines)


def definitions(prefix: str, *names: str, namespace: dict | None = None) -> dict[str, object]:
    """The functions and classes ``names`` as a notebook's code cells define them, run in ``namespace`` (what
    their bodies need: ``torch``, ``nn``, ``lab``...). Only those top-level definitions run, not the rest of
    their cells. Returns ``{name: object}`` in the order asked; a name the notebook does not define is an error."""
    namespace = {} if namespace is None else namespace
    path = notebook(prefix)
    found = set()
    for text in code_cells(prefix):
        for node in ast.parse(_without_magics(text)).body:
            defines = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            if defines and node.name in names:
                exec(compile(ast.Module([node], []), path.name, "exec"), namespace)
                found.add(node.name)
    missing = [name for name in names if name not in found]
    if missing:
        raise LookupError(f"{path.name} defines no {missing}")
    return {name: namespace[name] for name in names}


# --- one fresh interpreter for the checks that need one (process-wide state: TF32 at startup, what an import
# prints). Each test module registers its code at import; the ``fresh_interpreter`` fixture (tests/conftest.py)
# runs every registered part once, in ``order``, in one new interpreter, and hands each test its part's output.
FRESH_ENV = {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}  # NGC's variable; CUDA_HOME is set to an empty folder too
FRESH_PARTS: dict[str, tuple[int, str]] = {}  # name -> (order, code)
_PART = "### part "


def fresh_part(name: str, code: str, order: int = 50) -> str:
    """Register ``code`` to run in the shared fresh interpreter (lower ``order`` first); returns ``name``."""
    FRESH_PARTS[name] = (order, code)
    return name


def fresh_script() -> str:
    """One script running every registered part in its own namespace, each output under a ``### part`` line;
    a part that raises prints the error there (stdout), so the other parts still run."""
    lines = ["import traceback"]
    for name, (_, code) in sorted(FRESH_PARTS.items(), key=lambda item: item[1][0]):
        lines += [f"print({_PART + name!r}, flush=True)", "try:",
                  f"    exec(compile({code!r}, {name!r}, 'exec'), {{'__name__': '__main__'}})",
                  "except Exception:", "    print('raised:', traceback.format_exc().splitlines()[-1])"]
    return "\n".join(lines)


def split_parts(stdout: str) -> dict[str, str]:
    """``{name: what that part printed}`` from the fresh interpreter's stdout."""
    parts, name = {}, None
    for line in stdout.splitlines(keepends=True):
        if line.startswith(_PART):
            name = line[len(_PART):].rstrip("\n")
            parts[name] = ""
        elif name is not None:
            parts[name] += line
    return parts
