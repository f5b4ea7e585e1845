"""The generated modules of helpers/ are current (tools/export.py), and the generator does what it says."""
import json

import pytest

from tools import export


def test_committed_generated_files_are_current():
    assert export.stale(export.build()) == []


def notebook(tmp_path, cells):
    """A made-up notebook ``00_x.ipynb`` in ``tmp_path`` from (cell type, source, metadata) triples."""
    made = [{"cell_type": kind, "source": source, "metadata": metadata} for kind, source, metadata in cells]
    (tmp_path / "00_x.ipynb").write_text(json.dumps({"cells": made}))
    return tmp_path


EXPORT = {"tags": ["export"], "module": "timing"}


def test_definitions_are_stamped_and_imports_gathered_once(tmp_path):
    cells = [("markdown", "## 4. Timing", {}),
             ("code", "import torch\n\nLIMIT = 3\n\n\ndef f(x):\n    return x\n", EXPORT),
             ("code", "import torch\nimport math\n\n\nclass K:\n    \"\"\"A k.\"\"\"\n\n    n = 1\n", EXPORT)]
    found = export.export_cells(notebook(tmp_path, cells))
    text = export.module_text("timing", found)
    assert text.startswith("# Generated from notebooks 00 §4 by `python -m tools.export`")
    assert text.count("import torch") == 1 and "import math" in text
    assert '    """Defined in 00 §4."""\n    return x' in text
    assert '"""A k.\n\n    Defined in 00 §4.\n    """' in text
    assert "# Defined in 00 §4.\nLIMIT = 3" in text
    namespace = {}
    exec(compile(text, "timing.py", "exec"), namespace)
    assert namespace["f"](2) == 2 and namespace["K"].__doc__.startswith("A k.")


@pytest.mark.parametrize("source", ["x = f(2)\nprint(x)\n", "assert True\n", "%time 1\n", "a.b = 1\n"])
def test_an_export_cell_with_more_than_definitions_is_refused(tmp_path, source):
    found = export.export_cells(notebook(tmp_path, [("code", source, EXPORT)]))
    with pytest.raises(SystemExit):
        export.module_text("timing", found)


def test_an_unknown_module_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="module 'nb04'"):
        export.export_cells(notebook(tmp_path, [("code", "X = 1\n", {"tags": ["export"], "module": "nb04"})]))
