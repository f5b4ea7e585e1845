"""The pre-work smoke check, as the day will run: ``python -m tools.smoke`` (two minutes at most).

It checks what a workshop laptop fails on, in the order it fails:

1. the Python version (3.10 or newer);
2. a **fresh Jupyter kernel started in notebooks/**, where the course's kernels run, importing ``helpers``.
   From the repository root ``import helpers`` succeeds even when the editable install failed (the current
   directory is on ``sys.path``); from ``notebooks/`` it needs the install. The kernel then runs a second cell:
   the machine line and the course's rule for this machine (notebook 00 §1's first lines).

It prints what it found and, on a failure, what to do; it exits non-zero when something failed.
"""
from __future__ import annotations

import sys
from pathlib import Path

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
OLDEST_PYTHON = (3, 10)
CELLS = (
    "import helpers\nimport torch\nprint('helpers imported in the kernel, torch', torch.__version__)",
    "device = helpers.pick_device()\nprint(helpers.machine_stamp(device))\n"
    "advice = helpers.choose_precision(helpers.describe_device(device))\n"
    "print('training:', advice['training'].how, '-', advice['training'].reason)",
)
HINTS = {
    "ModuleNotFoundError": "the kernel cannot import the course: run `pip install -r requirements.txt` (it "
                           "installs helpers with `-e .`) in the environment Jupyter uses, and check that no error "
                           "scrolled past; in JupyterLab pick the kernel of that environment",
    "NoSuchKernel": "no Jupyter kernel: install the requirements (`pip install -r requirements.txt`) first",
}


def python_problem(version: tuple[int, ...] = tuple(sys.version_info[:2])) -> str | None:
    if tuple(version) >= OLDEST_PYTHON:
        return None
    wanted = ".".join(map(str, OLDEST_PYTHON))
    return (f"Python {'.'.join(map(str, version))}: the course needs {wanted} or newer (check with "
            "`python3 --version`, on Windows `py --version`; `py -3.12 -m venv .venv` picks one)")


def smoke_notebook():
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    return nb


def run_in_kernel(directory: Path = NOTEBOOK_DIR, timeout: int = 120) -> tuple[list[str], str | None]:
    """Run :data:`CELLS` in a fresh kernel started in ``directory``: (printed lines, the error or None)."""
    try:
        from nbclient import NotebookClient
    except ImportError as error:
        return [], f"ModuleNotFoundError: {error}"
    nb = smoke_notebook()
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                       resources={"metadata": {"path": str(directory)}}).execute()
    except Exception as error:  # no kernel at all, a kernel that died: the message says which
        return [], f"{type(error).__name__}: {error}"
    lines = []
    for cell in nb.cells:
        for output in cell.outputs:
            if output.output_type == "error":
                return lines, f"{output.ename}: {output.evalue}"
            if output.output_type == "stream" and output.name == "stdout":
                lines += output.text.splitlines()
    return lines, None


def hint(error: str) -> str:
    return next((text for name, text in HINTS.items() if error.startswith(name)), "ask at the workshop's start")


def main() -> int:
    problem = python_problem()
    if problem:
        print(f"FAILED: {problem}")
        return 1
    print(f"Python {sys.version.split()[0]}: fine")
    lines, error = run_in_kernel()
    for line in lines:
        print("  " + line)
    if error:
        print(f"FAILED in a fresh kernel started in notebooks/: {error}\n  what to do: {hint(error)}")
        return 1
    print("A fresh kernel in notebooks/ imports the course and prints the rule: ready for the workshop.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
