"""helpers.exercises, the checking core: answers compared with the computed solutions, judges run, feedback."""
import numpy as np
import pytest
import torch

import helpers
from helpers import exercises
from helpers.exercises import feedback, grade, solution

# Made-up exercises, one per kind of answer, so the core's rules are tested without computing a real solution.
MADE_UP = {"99.1": 1024, "99.2": True, "99.3": torch.float32, "99.4": 256.0}


@pytest.fixture
def made_up(monkeypatch):
    """Exercises 99.k answer with MADE_UP's values (tolerance 1e-6) through the real check, grade and feedback."""
    monkeypatch.setattr(exercises, "solution", MADE_UP.__getitem__)
    monkeypatch.setattr(exercises, "tolerance", lambda key: 1e-6)


def test_solutions_of_notebook_00():
    assert solution("00.1") == 256.0
    assert solution("00.2") == 1.0
    assert solution("00.3") == 2.0**-24


def test_check_accepts_right_rejects_wrong_and_waits_for_none(capsys):
    assert grade("00.1", 256) is True
    assert grade("00.1", 2048) is False
    assert grade("00.1", None) is None
    for answer, words in ((256, "correct!"), (2048, "not yet"), (None, "not answered yet")):
        assert helpers.check("00.1", answer) is None  # prints the verdict only: a cell shows no extra line
        assert words in capsys.readouterr().out


def test_check_tolerates_rounding_only_within_the_exercise_tolerance():
    assert grade("00.3", 5.96e-08)  # as printed in notebook 00
    assert not grade("00.3", 6e-08)
    assert grade("00.3", 6e-08, rel_tol=0.01)
    assert not grade("00.2", 1.0001)  # no tolerance entry: default 1e-6


def test_unknown_exercises_are_reported():
    with pytest.raises(KeyError, match="Unknown exercise"):
        solution("00.99")
    with pytest.raises(KeyError, match="No solutions for notebook 77"):
        solution("77.1")


def test_counts_and_yes_no_answers_are_exact(made_up):
    """Integer answers (bytes, counts) are exact, and a yes/no answer must be True or False, not 1 or 0."""
    assert grade("99.1", 1024) is True and grade("99.1", 1025) is False  # 1e-6 of 1024 would not tell them apart
    assert grade("99.1", 1024.0) is True
    assert grade("99.2", True) is True and grade("99.2", 1) is False and grade("99.2", False) is False
    assert feedback("99.2", 1) == "the answer should be True or False, not int"


def test_real_exercises_follow_the_same_rules():
    assert grade("02.3", 1024) is True and grade("02.3", 1025) is False and grade("02.3", np.int64(1024)) is True
    assert feedback("02.1", "torch.float32").startswith("the answer should be a dtype object")
    assert grade("02.1", torch.float32) is True


def test_numpy_scalars_count_as_their_number_or_bool(made_up):
    """An answer computed with NumPy (np.float32, np.int64, np.bool_, a one-element array) is graded as the
    Python number or bool it holds, not rejected as "not a number" or "not True or False"."""
    for right in (np.float32(256.0), np.float64(256.0), np.int64(256), np.array(256.0), np.array([256.0])):
        assert feedback("99.4", right) is None, type(right)
    assert grade("99.1", np.int64(1024)) is True and grade("99.1", np.int32(1025)) is False
    assert grade("99.2", np.bool_(True)) is True
    wrong = "that is not the value this exercise computes (the hint may help)"
    assert feedback("99.2", np.bool_(False)) == wrong
    assert feedback("99.4", np.float32(2048.0)) == wrong
    assert feedback("99.2", np.int64(1)) == "the answer should be True or False, not int"
    assert feedback("99.4", np.array([256.0, 256.0])) == "the answer should be a number, not ndarray"


def test_a_dtype_written_as_a_string_is_told_to_give_the_dtype_object(made_up, capsys):
    """"torch.float32" in quotes is the right name in the wrong type: the feedback says so, whatever the value,
    instead of calling it the wrong value."""
    for spelled in ("torch.float32", "float32", "torch.float16"):
        reason = feedback("99.3", spelled)
        assert reason.startswith("the answer should be a dtype object such as torch.float32"), spelled
        assert repr(spelled) in reason
    assert grade("99.3", torch.float32) is True
    assert feedback("99.3", torch.float16) == "that is not the value this exercise computes (the hint may help)"
    helpers.check("99.3", "torch.float32")
    assert "not yet: the answer should be a dtype object" in capsys.readouterr().out


def test_a_zero_dim_tensor_counts_as_its_number_and_check_never_raises(capsys):
    total = torch.zeros((), dtype=torch.bfloat16)
    for _ in range(1000):
        total = total + 1  # notebook 00's exercise, answered without .item()
    assert total.dim() == 0 and feedback("00.1", total) is None and grade("00.1", total) is True
    helpers.check("00.1", total)
    assert "correct!" in capsys.readouterr().out
    assert grade("00.1", torch.tensor([256.0])) is True          # any one-element tensor
    for odd in (torch.ones(2), "256", [256], object(), torch.ones(3, device="meta")):
        helpers.check("00.1", odd)                               # a verdict, never an exception
        assert "not yet" in capsys.readouterr().out


def test_a_bool_tensor_counts_as_a_yes_no_answer(made_up):
    assert grade("99.2", torch.tensor(True)) is True and grade("99.2", torch.tensor(False)) is False
    assert feedback("99.2", torch.tensor(1)) == "the answer should be True or False, not int"


def test_a_judge_whose_learner_code_raises_reports_it_in_one_line():
    def broken(losses):
        raise ValueError("first line\nsecond line")

    assert feedback("00.4", broken) == "running your code raised ValueError: first line"
    assert feedback("00.4", 2.3) == "the answer should be your repaired function itself (answer_4 = mean_of)"


def test_every_judge_of_notebooks_00_to_04_answers_with_why_not():
    for key in ("00.4", "02.4", "03.1", "03.2", "03.3", "04.3", "04.4", "04.5"):
        judge = solution(key)
        assert hasattr(judge, "why_not") and type(judge).__eq__ is object.__eq__  # judged by running, not ==
        assert judge.why_not(None) is not None and judge.why_not(0.5) is not None


@pytest.mark.slow  # runs seven judges (about 3 s)
def test_judges_run_in_a_clean_state_whatever_ran_before():
    """The expected behaviour is computed from fixed seeds, and the learner's global generator is left alone."""
    from helpers.solutions import nb02, nb03, nb04

    right = {"02.4": nb02.AttentionPool, "03.1": nb03.train_five_steps, "03.2": nb03.NearestCentre,
             "03.3": nb03.train_detector, "04.3": nb04.unscale_then_clip,
             "04.4": (nb04.save_with_scaler, nb04.load_with_scaler), "04.5": nb04.make_run}
    for seed, (key, answer) in enumerate(right.items()):
        torch.manual_seed(1000 + seed)  # any earlier cell's seed
        state = torch.get_rng_state()
        assert feedback(key, answer) is None, key
        assert torch.equal(torch.get_rng_state(), state), key
