import pytest

import helpers
from helpers.exercises import solution


def test_solutions_of_notebook_00():
    assert solution("00.1") == 256.0
    assert solution("00.2") == 1.0
    assert solution("00.3") == 2.0**-24


def test_check_accepts_right_rejects_wrong_and_waits_for_none(capsys):
    assert helpers.check("00.1", 256) is True
    assert helpers.check("00.1", 2048) is False
    assert helpers.check("00.1", None) is None
    out = capsys.readouterr().out
    assert "correct" in out and "not yet" in out and "not answered yet" in out


def test_check_tolerates_rounding_only_within_the_exercise_tolerance():
    assert helpers.check("00.3", 5.96e-08)  # as printed in notebook 00
    assert not helpers.check("00.3", 6e-08)
    assert helpers.check("00.3", 6e-08, rel_tol=0.01)
    assert not helpers.check("00.2", 1.0001)  # no tolerance entry: default 1e-6


def test_unknown_exercises_are_reported():
    with pytest.raises(KeyError, match="Unknown exercise"):
        solution("00.99")
    with pytest.raises(KeyError, match="No solutions for notebook 77"):
        solution("77.1")
