"""The 3-hour workshop route (tools/workshop.py) and the pre-flight report (tools/preflight.py)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support import cells, notebook, source
from tools import course_stats, preflight, workshop

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def test_the_route_is_planned_within_150_of_180_minutes_and_ends_on_the_take_home_recipe():
    stops = workshop.stops()
    assert workshop.total_minutes(stops) <= workshop.PLANNED_MINUTES <= workshop.WORKSHOP_MINUTES - 30
    assert stops[-1].notebook.startswith(workshop.RECIPE_NOTEBOOK) and stops[-1].script == workshop.TAKE_HOME_SCRIPT
    assert {"00", "03", "04"} <= {s.notebook[:2] for s in stops}  # formats, autocast training, GradScaler


def test_the_class_time_terms_are_the_least_squares_fit_of_the_instructors_estimates():
    switch, output, largest = workshop.fit()
    assert workshop.SWITCH_MINUTES == pytest.approx(switch, abs=0.05)
    assert workshop.OUTPUT_MINUTES == pytest.approx(output, abs=0.005)
    assert largest < 4  # minutes, at stop 00 (the instructor's 24 against the model's 20.6)
    model = [reading + workshop.SWITCH_MINUTES + workshop.OUTPUT_MINUTES * outputs
             for _, reading, outputs, _ in workshop.CALIBRATION]
    assert sum(model) == pytest.approx(sum(e for *_, e in workshop.CALIBRATION), abs=0.5)  # 173 min of stops


def test_the_plan_line_states_the_plan_the_cut_list_and_the_models_calibration_not_a_shifted_estimate():
    line = workshop.total_line()
    planned = workshop.rounded_minutes(workshop.total_minutes(workshop.stops()), 1)
    assert line.startswith(f"Planned: {planned} of 180 minutes")
    assert f"largest error on an instructor's per-stop estimates is {workshop.fit()[2]:.1f} min" in line
    recorded = workshop.RECORDED_ESTIMATE
    assert f"route at {recorded['commit']} was about {recorded['minutes']} minutes" in line
    assert "optimistic by" not in line and not hasattr(workshop, "estimate_minutes")
    old_route = tuple(workshop.RouteStop(s.notebook, s.parts, s.focus, s.script) for s in workshop.ROUTE)
    planned = workshop.total_minutes(workshop.stops())
    assert workshop.total_minutes(workshop.stops(old_route)) > planned + 5  # the skipped tangent was priced


def test_the_fit_is_least_squares():
    """A made-up calibration with known terms: the fit recovers them exactly."""
    made_up = [(f"s{n}", 10.0 + n, outputs, round(10.0 + n + 3.0 + 0.5 * outputs, 6))
               for n, outputs in enumerate((2, 4, 7, 11))]
    switch, output, largest = workshop.fit(made_up)
    assert (switch, output) == (pytest.approx(3.0), pytest.approx(0.5)) and largest == pytest.approx(0, abs=1e-9)


def test_class_time_is_reading_time_plus_the_model_terms():
    for stop in workshop.stops():
        assert stop.minutes == pytest.approx(stop.reading + workshop.SWITCH_MINUTES
                                             + workshop.OUTPUT_MINUTES * stop.outputs)
        assert stop.outputs >= 1


def test_the_clock_runs_through_onboarding_stops_breaks_and_wrap_up():
    stops = workshop.stops()
    rows = workshop.schedule(stops)
    assert rows[0] == (rows[0][0], 0.0, workshop.ONBOARDING_MINUTES)
    assert rows[-1][2] - rows[-1][1] == workshop.WRAP_UP_MINUTES
    assert all(a[2] == b[1] for a, b in zip(rows, rows[1:]))  # no gaps
    assert [r[2] - r[1] for r in rows if r[0] == "break"] == list(workshop.BREAKS.values()) == [15]
    assert [r[0] for r in rows if r[0].startswith("stop")] == [f"stop {n}" for n in range(1, len(stops) + 1)]
    assert workshop.total_minutes(stops) == rows[-1][2]
    assert workshop.clock(75.4) == "1:15" and workshop.clock(0) == "0:00"


def test_the_readme_shows_the_route_as_generated():
    assert workshop.readme_block() in README.read_text(), "regenerate it: python -m tools.workshop --write-readme"


def test_write_readme_replaces_the_route_block_once_and_is_idempotent(tmp_path):
    copy = tmp_path / "README.md"
    copy.write_text(README.read_text())
    workshop.write_readme(copy)
    once = copy.read_text()
    workshop.write_readme(copy)
    assert copy.read_text() == once and once.count("| # | Notebook | Sections") == 1
    assert workshop.readme_block() in once


def test_a_stop_takes_the_intro_and_the_listed_parts_not_the_summary():
    all_cells = cells(workshop.notebook_path("04"))
    indices = workshop.stop_indices("04", ("2",))
    texts = [source(all_cells[i]) for i in indices]
    assert texts[0].startswith("# 04 ·")
    headings = [t.splitlines()[0] for t in texts if t.startswith("## ")]
    assert [h.split()[1] for h in headings] == ["2."]
    with pytest.raises(ValueError, match="has no part"):
        workshop.stop_indices("00", ("99",))


def _notebook(path: Path, sources: list[tuple[str, str]]) -> None:
    cells = [{"cell_type": kind, "metadata": {}, "source": text,
              **({"outputs": [{"output_type": "stream", "name": "stdout", "text": "x"}], "execution_count": 1}
                 if kind == "code" else {})} for kind, text in sources]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))


def test_a_skipped_sub_section_runs_to_its_parts_end_and_keeps_the_recap(tmp_path, monkeypatch):
    monkeypatch.setattr(course_stats, "NOTEBOOK_DIR", tmp_path)
    _notebook(tmp_path / "42_made_up.ipynb", [
        ("markdown", "# 42 · made up"), ("code", "x = 1"),
        ("markdown", "## 1. One"), ("code", "y = x"), ("markdown", "A tangent: leftovers."), ("code", "t = 0"),
        ("markdown", workshop.RECAP_MARK + " One."),
        ("markdown", "## 2. Two"), ("code", "z = y"), ("markdown", "[next](43.ipynb)")])
    skips = (("1", "A tangent", "leftovers"),)
    assert workshop.stop_indices("42", ("1", "2"), skips=skips) == [0, 1, 2, 3, 6, 7, 8]
    route = (workshop.RouteStop("42", ("1", "2"), "both", skips=skips),)
    stop = workshop.stops(route)[0]
    assert stop.outputs == 3 and stop.reading == pytest.approx(workshop.cells_minutes(
        workshop.stop_cells("42", ("1", "2"), skips=skips)))
    assert "1 without leftovers" in workshop.route_markdown(route)
    assert workshop.skip_lines(route)[0].startswith("- 42 §1, leftovers (from \"A tangent\"")
    with pytest.raises(ValueError, match="0 cells start with"):
        workshop.stop_indices("42", ("1",), skips=(("1", "No such cell", "x"),))


def test_the_route_skips_04s_leftover_micro_batch_tangent_and_keeps_the_loop_and_its_explanation():
    route = {s.notebook: s for s in workshop.ROUTE}
    assert "2" in route["01"].parts and "4" in route["04"].parts
    cells = workshop.stop_cells("04", route["04"].parts, skips=route["04"].skips)
    text = "\n".join(course_stats._source(c) for c in cells)
    assert "def accumulate(" not in text and "accumulation_steps" in text  # the loop stays, the tangent goes
    assert "In the cell: **accumulation**" in text  # the loop's explanation stays
    assert "drop_last" not in text  # the recap recaps only what the stop ran
    kept = set(workshop.KEPT)
    assert {("01", "2"), ("04", "4"), ("03", "The recipe"), ("04", "1"), ("07", "6")} <= kept
    assert not kept & {(prefix, part) for prefix, part, _ in workshop.CUTS}


def test_a_stop_ends_on_its_recap_and_a_cut_keeps_the_recap(tmp_path, monkeypatch):
    monkeypatch.setattr(course_stats, "NOTEBOOK_DIR", tmp_path)
    _notebook(tmp_path / "42_made_up.ipynb", [
        ("markdown", "# 42 · made up"), ("code", "x = 1"),
        ("markdown", "## 1. One"), ("code", "y = x"),
        ("markdown", "## 2. Two"), ("code", "z = y"), ("markdown", workshop.RECAP_MARK + " One, then two."),
        ("markdown", "## Summary"), ("markdown", "| a | b |"), ("markdown", "[next](43.ipynb)")])
    assert workshop.stop_indices("42", ("1", "2")) == [0, 1, 2, 3, 4, 5, 6]
    assert workshop.has_recap("42", ("1", "2")) and not workshop.has_recap("42", ("1",))
    assert workshop.stop_indices("42", ("1", "2"), cut="2") == [0, 1, 2, 3, 6]
    assert workshop.section_minutes("42", "2") == pytest.approx(2 / 200 + 1 * 10 / 60 + workshop.OUTPUT_MINUTES)


def test_each_stop_ends_on_its_recap_cell():
    """Each stop's last section ends on a markdown cell starting "**Recap of this stop.**" (the notebooks'
    owners add them; until every one has, this test fails and ``--run`` prints a NOTE per stop)."""
    missing = [f"{s.notebook} §{s.parts[-1]}" for s in workshop.ROUTE
               if not workshop.has_recap(s.notebook, s.parts, s.skips)]
    assert not missing, f"no recap cell ends: {missing}"


def test_the_cut_list_saves_20_minutes_names_route_sections_or_the_scripts_functions_and_keeps_the_loops():
    route = {s.notebook: s for s in workshop.ROUTE}
    for prefix, part, what in workshop.CUTS:
        assert what.startswith("say it:") and workshop.cut_minutes(prefix, part) > 1
        if part.startswith(workshop.SCRIPT_CUT):
            names = workshop.script_cut_functions(part)
            assert route[prefix].script == workshop.TAKE_HOME_SCRIPT
            assert not set(names) & set(workshop.KEPT_FUNCTIONS)
        else:
            assert part in route[prefix].parts
    assert workshop.cut_total() >= 20
    assert len(workshop.cut_lines()) == len(workshop.CUTS)


def test_a_script_cut_counts_its_functions_lines_and_refuses_a_name_the_script_lacks(tmp_path, monkeypatch):
    script = tmp_path / "s.py"
    script.write_text('"""Doc."""\n\n\ndef kept():\n    return 1\n\n\ndef cut(x):\n    """Two."""\n\n'
                      '    return x\n')
    monkeypatch.setattr(workshop, "ROOT", tmp_path)
    assert workshop.function_lines("s.py", ("cut",)) == 3 and workshop.function_lines("s.py", ("kept", "cut")) == 5
    with pytest.raises(ValueError, match="no top-level function"):
        workshop.function_lines("s.py", ("missing",))
    assert workshop.script_cut_functions(workshop.SCRIPT_CUT + "a, b") == ("a", "b")


def test_the_script_cut_names_the_recipes_top_level_functions_outside_its_copy_and_demo_run():
    text = (ROOT / workshop.TAKE_HOME_SCRIPT).read_text()
    read_in_class = text[text.index(workshop.COPY_END):text.index(workshop.HOME_START)]
    for _, part, _ in workshop.CUTS:
        if part.startswith(workshop.SCRIPT_CUT):
            for name in workshop.script_cut_functions(part):
                assert f"\ndef {name}(" in read_in_class


def test_the_script_is_read_without_its_verbatim_copy_and_docstring(tmp_path, monkeypatch):
    script = tmp_path / "s.py"
    script.write_text('"""Two words."""\nimport torch\n\n' + workshop.COPY_START + " of x\ndef f():\n    pass\n"
                      + workshop.COPY_END + "\nprint(1)\n")
    monkeypatch.setattr(workshop, "ROOT", tmp_path)
    assert workshop.script_lines("s.py") == 2 and workshop.script_words("s.py") == 2


def test_no_route_section_names_a_term_that_only_a_skipped_section_defines():
    """Fresh-kernel runs check a stop's code; this checks its prose against data/route_terms.json."""
    assert workshop.prose_leaks() == []


def test_route_outputs_are_checked_too_with_the_rules_reasons_on_every_machine_class(tmp_path, monkeypatch):
    monkeypatch.setattr(course_stats, "NOTEBOOK_DIR", tmp_path)
    _notebook(tmp_path / "42_made_up.ipynb", [
        ("markdown", "# 42 · made up"), ("markdown", "## 1. One"), ("code", "print('the widget')"),
        ("code", "helpers.choose_precision(d)"), ("markdown", "## 2. Two"), ("markdown", "The *widget*."),
        ("markdown", "[next](43.ipynb)")])
    terms = tmp_path / "terms.json"
    terms.write_text(json.dumps({"42": {"2": ["widget"]}, "43": {"2": ["gizmo-bound"]}}))
    assert len(workshop.rule_reasons()) > len(workshop.MACHINE_CLASSES) / 2  # one per class and workload, deduplicated
    monkeypatch.setattr(workshop, "rule_reasons", lambda: ["CPU (no flags): slower where gizmo-bound"])
    route = (workshop.RouteStop("42", ("1",), "one"),)
    texts = [text for _, text in workshop.route_texts(route[0])]
    assert texts == ["## 1. One", "x", "x", "CPU (no flags): slower where gizmo-bound"]  # made-up outputs: "x"
    assert workshop.prose_leaks(route, terms) == ["42 §1 names 'gizmo-bound' (defined in 43 §2, not on the route)"]


def test_every_listed_term_occurs_in_the_section_or_skipped_sub_section_that_defines_it():
    terms = json.loads(workshop.TERMS_FILE.read_text())
    skips = {(s.notebook, workshop.skip_key(part, what)): skip for s in workshop.ROUTE
             for skip in s.skips for part, _, what in (skip,)}
    for prefix, sections in ((p, s) for p, s in terms.items() if not p.startswith("_")):
        labelled = course_stats._labelled_cells(workshop.notebook_path(prefix))
        for section, listed in sections.items():
            if ":" in section:
                assert (prefix, section) in skips, f"{prefix} {section!r}: no such skip in the route"
                indices = workshop.skipped_indices(labelled, (skips[prefix, section],))
                chosen = [labelled[index][1] for index in sorted(indices)]
            else:
                chosen = [cell for label, cell in labelled if label == section]
            text = "\n".join(course_stats._source(cell) for cell in chosen)
            missing = [t for t in listed if not workshop.term_pattern(t).search(text)]
            assert not missing, f"{prefix} §{section} no longer has {missing}: update data/route_terms.json"


def test_a_recap_that_describes_a_skipped_sub_section_fails_the_route_check(tmp_path, monkeypatch):
    monkeypatch.setattr(course_stats, "NOTEBOOK_DIR", tmp_path)
    recap = workshop.RECAP_MARK + " Section 1: the loop; the leftover *widgets* step too."
    _notebook(tmp_path / "42_made_up.ipynb", [
        ("markdown", "# 42 · made up"), ("markdown", "## 1. One"), ("markdown", "The loop."), ("code", "x = 1"),
        ("markdown", "A tangent: leftover **widgets**."), ("code", "t = 0"), ("markdown", recap),
        ("markdown", "[next](43.ipynb)")])
    terms = tmp_path / "terms.json"
    terms.write_text(json.dumps({"42": {"1": ["loop"], "1: leftovers": ["widget"]}}))
    skips = (("1", "A tangent", "leftovers"),)
    route = (workshop.RouteStop("42", ("1",), "one", skips=skips),)
    assert workshop.prose_leaks(route, terms) == [
        "42 §1 names 'widget' (defined in 42 §1: leftovers, not on the route)"]
    honest = recap.replace("; the leftover *widgets* step too", "")
    _notebook(tmp_path / "42_made_up.ipynb", [
        ("markdown", "# 42 · made up"), ("markdown", "## 1. One"), ("markdown", "The loop."), ("code", "x = 1"),
        ("markdown", "A tangent: leftover **widgets**."), ("code", "t = 0"), ("markdown", honest),
        ("markdown", "[next](43.ipynb)")])
    assert workshop.prose_leaks(route, terms) == []
    unskipped = (workshop.RouteStop("42", ("1",), "one"),)
    assert workshop.prose_leaks(unskipped, terms) == []  # not skipped: the tangent defines it on the route


def test_prose_leaks_finds_a_skipped_sections_term_unless_defined_or_cited_elsewhere(tmp_path, monkeypatch):
    monkeypatch.setattr(course_stats, "NOTEBOOK_DIR", tmp_path)
    _notebook(tmp_path / "42_made_up.ipynb", [
        ("markdown", "# 42 · made up: the widget and the gizmo"), ("markdown", "## 1. One"),
        ("markdown", "The *sprocket* turns. Unlike the widget (§2), the gizmo ([43 §1](43_other.ipynb)) waits."),
        ("markdown", "## 2. Two"), ("markdown", "The widget spins."), ("markdown", "[next](43.ipynb)")])
    _notebook(tmp_path / "43_other.ipynb", [
        ("markdown", "# 43"), ("markdown", "## 1. One"), ("markdown", "The gizmo; the sprocket; the doohickey."),
        ("markdown", "[end](44.ipynb)")])
    terms = tmp_path / "terms.json"
    terms.write_text(json.dumps({"42": {"2": ["widget"]}, "43": {"1": ["gizmo", "sprocket", "doohickey"]}}))
    route = (workshop.RouteStop("42", ("1",), "one"),)
    assert workshop.prose_leaks(route, terms) == ["42 §1 names 'widget' (defined in 42 §2, not on the route)"]
    assert workshop.prose_leaks((workshop.RouteStop("42", ("1", "2"), "both"),), terms) == []


def test_the_instructor_notes_carry_the_generated_clock_cut_list_fit_and_machine_table(tmp_path):
    text = workshop.INSTRUCTORS.read_text()
    for name, block in workshop.generated_blocks().items():
        assert f"<!-- tools.workshop {name} -->\n{block}\n<!-- /tools.workshop -->" in text, \
            f"docs/instructors.md: regenerate the {name} (python -m tools.workshop --write-readme)"
    copy = tmp_path / "instructors.md"
    copy.write_text(text.replace("| 0:15 |", "| 0:16 |"))
    workshop.write_docs(copy)
    assert copy.read_text() == text


def test_the_machine_table_follows_the_rule():
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in
             workshop.machine_classes_markdown().splitlines()[2:]]
    rows = {row[0]: row[2:5] for row in cells}
    assert rows["x86 CPU, AVX2 only"] == ["float32", "float32", "measure"]
    assert rows["x86 CPU, AVX512-BF16"][0] == "autocast, bfloat16"
    assert rows["NVIDIA T4"][0] == "autocast + GradScaler, float16"
    assert rows["Windows, flags unreadable"] == ["measure"] * 3
    apple_gpus = [row for name, row in rows.items() if name.startswith("Apple GPU")]
    assert len(apple_gpus) == 5 and not any("float16" in row[0] for row in apple_gpus)  # no Mac run: no fp16 training
    assert rows["Apple GPU, torch 2.8+, macOS 14+"][0] == "measure"


ROUTE_RUNS = os.environ.get("AMP_COURSE_ROUTE") == "1"


@pytest.mark.skipif(not ROUTE_RUNS, reason="runs every stop in a fresh kernel (2 minutes): AMP_COURSE_ROUTE=1")
@pytest.mark.parametrize("stop", workshop.ROUTE, ids=[s.notebook for s in workshop.ROUTE])
def test_each_stop_runs_as_listed_from_a_fresh_kernel(stop):
    assert workshop.run_stop(stop.notebook, stop.parts, skips=stop.skips) == []


def _cut_stops() -> list[tuple[str, tuple[str, ...]]]:
    """(notebook, parts cut) for each cut of the list that leaves cells out, with every earlier cut of the same
    stop taken too (the list is taken in order)."""
    runs = []
    for number, (prefix, part, _) in enumerate(workshop.CUTS):
        earlier = tuple(p for q, p, _ in workshop.CUTS[:number + 1] if q == prefix)
        if workshop.cut_parts(earlier) and not part.startswith(workshop.SCRIPT_CUT):
            runs.append((prefix, workshop.cut_parts(earlier)))
    return runs


@pytest.mark.skipif(not ROUTE_RUNS, reason="runs each cut stop in a fresh kernel: AMP_COURSE_ROUTE=1")
@pytest.mark.parametrize("prefix, parts", _cut_stops(), ids=[f"{p}-{'+'.join(c)}" for p, c in _cut_stops()])
def test_each_stop_runs_without_its_cut_sections(prefix, parts):
    stop = next(s for s in workshop.ROUTE if s.notebook == prefix)
    assert workshop.run_stop(prefix, stop.parts, cut=parts, skips=stop.skips) == []


class _Report:
    def __init__(self, nodeid, outcome="passed", when="call", duration=0.5):
        self.nodeid, self.when, self.duration = nodeid, when, duration
        self.failed, self.passed = outcome == "failed", outcome == "passed"


def test_the_preflight_report_names_the_failing_notebook_section_and_what_it_means(monkeypatch):
    monkeypatch.setattr(preflight, "machine_lines", lambda threads: ["Machine: a test machine"])
    recorder = preflight.Recorder()
    recorder.add(_Report("tests/test_state.py::test_x"))
    recorder.add(_Report("notebooks/04_grad_scaler.ipynb::Cell 0"))
    recorder.add(_Report("notebooks/04_grad_scaler.ipynb::Cell 3", outcome="failed"))
    text = "\n".join(preflight.report_lines(recorder))
    assert "Machine: a test machine" in text
    assert "unit tests" in text and "04_grad_scaler.ipynb" in text and "FAILED (1)" in text
    index = [i for i, c in enumerate(cells(notebook("04"))) if c["cell_type"] == "code"][3]
    assert f"Cell 3 (notebook cell {index}), in ## " in text


def test_the_smoke_check_wants_python_3_10_and_names_py_for_windows():
    from tools import smoke

    assert smoke.python_problem((3, 10)) is None and smoke.python_problem((3, 12)) is None
    problem = smoke.python_problem((3, 9))
    assert "3.10 or newer" in problem and "py --version" in problem
    assert "pip install -r requirements.txt" in smoke.hint("ModuleNotFoundError: No module named 'helpers'")


def test_the_smoke_check_runs_in_a_fresh_kernel_started_in_notebooks(monkeypatch):
    """The kernel starts in notebooks/ (where `import helpers` needs the install, not the current directory) and
    reports a failing cell as an error, not as a pass."""
    from tools import smoke

    assert smoke.NOTEBOOK_DIR == ROOT / "notebooks" and "import helpers" in smoke.CELLS[0]
    probe = "import os, sys\nprint('cwd', os.path.basename(os.getcwd()))"
    monkeypatch.setattr(smoke, "CELLS", (smoke.CELLS[0], probe, "import no_such_module_for_the_smoke_check"))
    lines, error = smoke.run_in_kernel()
    assert lines[0].startswith("helpers imported in the kernel") and "cwd notebooks" in lines
    assert error.startswith("ModuleNotFoundError") and "no_such_module_for_the_smoke_check" in error
