import pytest

import helpers
from helpers.exercises import grade, solution


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


def test_counts_and_yes_no_answers_are_exact():
    """Integer answers (bytes, counts) are exact, and a yes/no answer must be True or False, not 1 or 0."""
    assert grade("02.3", 1024) is True and grade("02.3", 1025) is False  # 1e-6 of 1024 would not tell them apart
    assert grade("02.3", 1024.0) is True
    yes_no = [key for key in ("05.3", "06.2", "06.3") if isinstance(solution(key), bool)]
    assert yes_no, "some exercise has a True/False answer"
    for key in yes_no:
        right = solution(key)
        assert grade(key, right) is True and grade(key, int(right)) is False and grade(key, not right) is False
