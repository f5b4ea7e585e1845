"""The one copy rule (tools/copies.py): every marked copy in a notebook cell is AST-equal to its helper, docstrings
included; the take-home recipe's rule is what ``python -m tools.copies --write`` writes; and the check fails when
any copy drifts by one token, loses its marker, or the recipe goes stale."""
from __future__ import annotations

import ast
import json
import shutil

import pytest

from tests.support import cells
from tools import copies

COPIES = copies.marked_copies()
MARKED = [(copy, name) for copy in COPIES for name in copy.names]


def test_every_marked_copy_and_the_recipe_are_current():
    assert copies.problems() == []


def test_the_check_finds_the_courses_copies():
    """The timing method (01 §4), the rule (07 §1) and 09 §1's step and op log are marked, so checked."""
    found = {(copy.where.split("_")[0], copy.module, name) for copy, name in MARKED}
    expected = {("01", "timing", "compare"), ("01", "timing", "decide"), ("07", "precision", "choose_precision"),
                ("07", "precision", "NO_TENSOR_CORES"), ("09", "nb09", "Step"), ("09", "nb09", "OpLog")}
    assert expected <= found


def _mutated(source: str, name: str, how: str) -> str:
    """``source`` with the definition ``name`` changed: a statement added, or its docstring changed."""
    tree = ast.parse(copies._without_magics(source))
    names = [getattr(node, "name", None) or getattr(getattr(node, "targets", [None])[0], "id", None)
             for node in tree.body]
    node = tree.body[names.index(name)]
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        node.value = ast.Tuple([node.value, ast.Constant(1)], ast.Load())
    elif how == "docstring" and ast.get_docstring(node) is not None:
        node.body[0].value.value += "."
    else:
        node.body.append(ast.Pass())
    return ast.unparse(tree)


@pytest.mark.parametrize("how", ["statement", "docstring"])
@pytest.mark.parametrize("copy, name", MARKED, ids=[f"{c.where.split('_')[0]}-{n}" for c, n in MARKED])
def test_a_changed_copy_is_caught(copy, name, how):
    """Each marked definition, changed (a statement added, or one character of its docstring): the check fails and
    names it; the unchanged cell, unparsed the same way, passes (so only the change is caught)."""
    tree = ast.parse(copies._without_magics(copy.source))
    assert copies.drift(copy._replace(source=ast.unparse(tree))) == []
    changed = copy._replace(source=_mutated(copy.source, name, how))
    problems = copies.drift(changed)
    assert len(problems) == 1 and f"{name} differs from helpers.{copy.module}" in problems[0]


def test_one_changed_token_in_the_notebook_s_compare_is_caught():
    (copy,) = [copy for copy in COPIES if "compare" in copy.names]
    changed = copy.source.replace("ratios.append(", "ratios.append(1 + ", 1)
    assert changed != copy.source
    assert copies.drift(copy._replace(source=changed)) == [f"{copy.where}: compare differs from helpers.timing.compare"]


def test_a_marker_naming_what_the_cell_does_not_define_is_caught():
    copy = COPIES[0]
    assert "not define it" in copies.drift(copy._replace(names=("no_such_name",)))[0]


def test_a_copy_without_its_marker_is_caught(tmp_path):
    (copy,) = [copy for copy in COPIES if "OpLog" in copy.names]
    name = copy.where.split(",")[0]
    shutil.copy(copies.NOTEBOOK_DIR / name, tmp_path / name)
    assert copies.unmarked_copies(tmp_path) == []
    changed = cells(tmp_path / name)
    for cell in changed:
        cell["source"] = [line for line in cell["source"] if not line.startswith("# copy of helpers.nb09: OpLog")]
    (tmp_path / name).write_text(json.dumps({"cells": changed}))
    found = copies.unmarked_copies(tmp_path)
    assert {problem.split(": ")[1].split(" is a copy")[0] for problem in found} == {"OpLog", "ops", "casts"}


def test_the_recipe_s_rule_is_written_not_typed():
    recipe, rule = copies.RECIPE.read_text(), copies.RULE.read_text()
    assert copies.written_recipe(recipe, rule) == recipe
    assert copies.rule_text(rule) in recipe and '"""Which precision to use' not in copies.rule_text(rule)
    drifted = recipe.replace("capability >= (8, 0)", "capability >= (7, 5)", 1)
    assert drifted != recipe
    assert copies.recipe_problems(drifted, rule) != []
    assert copies.written_recipe(drifted, rule) == recipe  # --write repairs it


def test_the_recipe_must_import_what_the_rule_needs():
    recipe, rule = copies.RECIPE.read_text(), copies.RULE.read_text()
    without = recipe.replace("\nimport subprocess\n", "\n", 1)
    assert without != recipe
    assert any("import the recipe lacks" in problem for problem in copies.recipe_problems(without, rule))


def test_write_is_the_command_line_s(tmp_path, monkeypatch, capsys):
    recipe = tmp_path / "take_home_recipe.py"
    recipe.write_text(copies.RECIPE.read_text().replace("capability >= (8, 0)", "capability >= (7, 5)", 1))
    monkeypatch.setattr(copies, "RECIPE", recipe)
    assert copies.main([]) == 1
    assert copies.main(["--write"]) == 0
    assert recipe.read_text() == (copies.NOTEBOOK_DIR / "take_home_recipe.py").read_text()
    assert "current" in capsys.readouterr().out.splitlines()[-1]
