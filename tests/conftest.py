"""Unit tests measure into a private speed-profile cache, never the learner's ~/.cache/amp-course; and every
notebook cell nbval collects is marked ``slow``, so ``pytest -m "not slow"`` is the fast loop (CONTRIBUTING)."""
import itertools
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from tests import support

_fresh = itertools.count()


@pytest.fixture(autouse=True)
def private_speed_cache(tmp_path_factory, monkeypatch):
    """A cache directory of this test's own (not created until something is cached in it)."""
    directory = tmp_path_factory.getbasetemp() / f"amp-course-cache-{next(_fresh)}"
    monkeypatch.setenv("AMP_COURSE_CACHE", str(directory))


class FreshRun(NamedTuple):
    parts: dict[str, str]  # what each registered part printed
    stderr: str  # what the whole interpreter printed there (nothing, unless something warned)
    returncode: int


@pytest.fixture(scope="session")
def fresh_interpreter(tmp_path_factory) -> FreshRun:
    """Every part registered with ``tests.support.fresh_part``, run once in one new interpreter (one torch import
    for all: issue 42), with NGC's TF32 variable set and CUDA_HOME pointing at an empty folder."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "CUDA_HOME": str(tmp_path_factory.mktemp("cuda_home")),
           **support.FRESH_ENV}
    done = subprocess.run([sys.executable, "-c", support.fresh_script()], env=env, capture_output=True, text=True,
                          timeout=300)
    return FreshRun(support.split_parts(done.stdout), done.stderr, done.returncode)


# Unit tests over about 2 s on a quiet 2-core CPU, in test files whose owners have not shrunk them yet (issue 33:
# the smallest model that still catches the wrong answer, fresh interpreters merged). Marked slow here so the fast
# loop is fast now; delete an entry once its test is fast (or marked @pytest.mark.slow in its own file). Each entry
# is a test function (all its parameters); an entry that matches no collected test is listed after the run.
SLOW_UNTIL_SHRUNK = (
    "tests/test_bench.py::test_main_quick_records_a_valid_file",
    "tests/test_bench.py::test_only_tf32_modes_run_with_tf32_on_and_every_measurement_warms_up_first",
    "tests/test_bench.py::test_train_step_leaves_the_model_alone_and_counts_gradients",
    "tests/test_nb01.py::test_01_1_saved_bytes_of_the_half_model",
    "tests/test_nb01.py::test_01_4_right_repairs_are_accepted",
    "tests/test_nb01.py::test_01_4_wrong_repairs_are_rejected_with_what_failed",
    "tests/test_nb01.py::test_01_4_the_notebook_s_own_images_would_not_catch_a_fixed_shift",
    "tests/test_nb03.py::test_compare_training_gives_float16_a_scaler",
    "tests/test_nb03.py::test_compare_training_starts_from_the_same_loss_and_reports_both_runs",
    "tests/test_nb03.py::test_03_3_the_wrong_repairs_are_rejected_and_the_fix_accepted",
    "tests/test_nb04.py::test_04_5_right_repairs_written_differently_pass",
    "tests/test_nb04.py::test_train_faint_underflows_without_a_scaler_and_matches_float32_with_one",
    "tests/test_nb05.py::test_solution_05_3_batchnorm_breaks_gradient_averaging",
    "tests/test_nb06.py::test_06_4_a_hard_coded_dtype_fails_where_the_machine_s_autocast_dtype_differs",
    "tests/test_nb06.py::test_06_4_serving_result_shows_the_broken_recipe_s_symptoms",
    "tests/test_nb06.py::test_06_4_the_solution_and_a_repair_written_differently_are_accepted",
    "tests/test_nb06.py::test_06_4_wrong_repairs_are_rejected_with_what_failed",
    "tests/test_nb06.py::test_solution_06_3_fp16_headroom_on_the_photo",
    "tests/test_nb07.py::test_exercise_07_1_judges_the_repaired_class_and_names_what_fails",
    "tests/test_nb07.py::test_solution_07_2_is_the_boundary_of_overflow",
    "tests/test_nb07.py::test_the_checks_leave_the_learners_random_state_alone",
)
_unmatched = []


def _function_id(item) -> str:
    """``tests/test_x.py::test_name`` of a test item, without its parameters."""
    return item.nodeid.split("[")[0]


def pytest_collection_modifyitems(config, items):
    """A notebook's cells run its whole kernel: slow, whatever a cell's own time (nbval collects them); and the
    unit tests of SLOW_UNTIL_SHRUNK are slow until their owners shrink them."""
    functions = {_function_id(item) for item in items}
    files = {function.split("::")[0] for function in functions}
    for item in items:
        if str(item.path).endswith(".ipynb") or _function_id(item) in SLOW_UNTIL_SHRUNK:
            item.add_marker(pytest.mark.slow)
    _unmatched[:] = [entry for entry in SLOW_UNTIL_SHRUNK
                     if entry.split("::")[0] in files and entry not in functions]


def pytest_terminal_summary(terminalreporter):
    for entry in _unmatched:
        terminalreporter.write_line(f"tests/conftest.py: SLOW_UNTIL_SHRUNK names no test: {entry} (delete it)")
