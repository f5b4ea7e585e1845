import pytest
import torch

import helpers
from helpers.exercises import feedback, grade, solution


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


def test_a_bool_tensor_counts_as_a_yes_no_answer():
    key = next(key for key in ("05.3", "06.2", "06.3") if isinstance(solution(key), bool))
    right = solution(key)
    assert grade(key, torch.tensor(right)) is True and grade(key, torch.tensor(not right)) is False
    assert feedback(key, torch.tensor(1)) == "the answer should be True or False, not int"


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
