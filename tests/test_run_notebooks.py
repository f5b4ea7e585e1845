
import nbformat

from tests.support import cells as notebook_cells
from tools.run_notebooks import run_notebook


def test_run_notebook_executes_in_place_and_trims_demonstrated_tracebacks(tmp_path):
    path = tmp_path / "99_demo.ipynb"
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("print(6 * 7)"),
        nbformat.v4.new_code_cell("import json\njson.loads('{')",
                                  metadata={"tags": ["raises-exception", "nbval-ignore-output"]}),
        nbformat.v4.new_code_cell("undefined_name"),
        nbformat.v4.new_code_cell("import sys\nprint('careful', file=sys.stderr)"),
    ])
    nbformat.write(nb, path)
    problems = run_notebook(path)
    cells = notebook_cells(path)
    assert [c["execution_count"] for c in cells] == [1, 2, 3, 4]
    assert "".join(cells[0]["outputs"][0]["text"]) == "42\n"
    demonstrated = cells[1]["outputs"][0]
    assert demonstrated["ename"] == "JSONDecodeError" and len(demonstrated["traceback"]) == 1
    assert len(problems) == 2
    assert "cell 2: unexpected NameError" in problems[0] and "cell 3: stderr" in problems[1]
    assert "execution" not in cells[0]["metadata"]
