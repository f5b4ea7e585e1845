"""The 3-hour workshop route (tools/workshop.py) and the pre-flight report (tools/preflight.py)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tools import preflight, workshop

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# The seeds' lesson, by the notebook that teaches each part of it: formats, .half() deployment, the new_zeros
# trick, autocast training, GradScaler, the DataParallel pitfall.
SEED_LESSON = {"00", "01", "02", "03", "04", "05"}


def test_the_route_fits_three_hours_by_the_class_time_model_and_covers_the_seeds_lesson():
    stops = workshop.stops()
    assert workshop.total_minutes(stops) <= workshop.WORKSHOP_MINUTES
    assert SEED_LESSON <= {s.notebook[:2] for s in stops}
    assert stops[-1].notebook.startswith(workshop.RECIPE_NOTEBOOK), "the route ends on the recipe"


def test_class_time_is_more_than_reading_time_by_the_model_terms():
    for stop in workshop.stops():
        assert stop.minutes == pytest.approx(stop.reading + workshop.SWITCH_MINUTES
                                             + workshop.OUTPUT_MINUTES * stop.outputs)
        assert stop.outputs >= 1


def test_the_readme_shows_the_route_as_generated():
    assert workshop.route_markdown() in README.read_text(), "regenerate it: python -m tools.workshop"


def test_a_stop_takes_the_intro_the_listed_parts_and_the_summary_only():
    cells = json.loads(workshop.notebook_path("04").read_text())["cells"]
    indices = workshop.stop_indices("04", ("2",))
    texts = ["".join(cells[i]["source"]) for i in indices]
    assert texts[0].startswith("# 04 ·")
    headings = [t.splitlines()[0] for t in texts if t.startswith("## ")]
    assert [h.split()[1] for h in headings] == ["2.", "Summary"]
    with pytest.raises(ValueError, match="has no part"):
        workshop.stop_indices("00", ("99",))


@pytest.mark.skipif(os.environ.get("AMP_COURSE_ROUTE") != "1",
                    reason="runs every stop in a fresh kernel (a minute): AMP_COURSE_ROUTE=1, as CI does")
@pytest.mark.parametrize("prefix, parts", [(p, parts) for p, parts, _ in workshop.ROUTE],
                         ids=[p for p, _, _ in workshop.ROUTE])
def test_each_stop_runs_as_listed_from_a_fresh_kernel(prefix, parts):
    assert workshop.run_stop(prefix, parts) == []


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
    cells = json.loads((ROOT / "notebooks" / "04_grad_scaler.ipynb").read_text())["cells"]
    index = [i for i, c in enumerate(cells) if c["cell_type"] == "code"][3]
    assert f"Cell 3 (notebook cell {index}), in ## " in text
