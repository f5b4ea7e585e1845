"""Checkable exercises: ``check("00.1", answer)`` compares an answer with a solution computed by
the functions of ``helpers/solutions/nbNN.py`` (never typed in); ``TOLERANCES`` for rounded ones."""
from __future__ import annotations

import importlib
import math
from types import ModuleType
from typing import Any

def _solutions_module(key: str) -> ModuleType:
    notebook = key.split(".")[0]
    try:
        module = importlib.import_module(f"helpers.solutions.nb{notebook}")
    except ModuleNotFoundError as error:
        raise KeyError(f"No solutions for notebook {notebook} (exercise {key!r})") from error
    if key not in module.SOLUTIONS:
        raise KeyError(f"Unknown exercise {key!r}; known: {', '.join(sorted(module.SOLUTIONS))}")
    return module


def solution(key: str) -> Any:
    """The computed answer of exercise ``key`` ("NN.k": notebook NN, exercise k)."""
    return _solutions_module(key).SOLUTIONS[key]()


def tolerance(key: str) -> float:
    """The relative tolerance of exercise ``key`` (its module's TOLERANCES entry, else 1e-6)."""
    return getattr(_solutions_module(key), "TOLERANCES", {}).get(key, 1e-6)


def _matches(answer: Any, expected: Any, rel_tol: float) -> bool:
    if isinstance(expected, bool) or isinstance(answer, bool):
        return answer is expected  # 0 is not False: a yes/no question wants True or False
    if isinstance(expected, int) and isinstance(answer, (int, float)):
        return answer == expected  # a count or a number of bytes is exact: no tolerance
    if isinstance(expected, (int, float)) and isinstance(answer, (int, float)):
        if math.isnan(expected):
            return math.isnan(answer)
        return math.isclose(answer, expected, rel_tol=rel_tol, abs_tol=0.0)
    if isinstance(expected, str) and isinstance(answer, str):
        return answer.strip().lower() == expected.strip().lower()
    return answer == expected


def grade(key: str, answer: Any, rel_tol: float | None = None) -> bool | None:
    """True/False, or None if not answered yet: integer answers (counts, bytes) exact, yes/no ones
    booleans, other numbers within ``rel_tol`` (default: :func:`tolerance`)."""
    if answer is None:
        return None
    return _matches(answer, solution(key), tolerance(key) if rel_tol is None else rel_tol)


def check(key: str, answer: Any, rel_tol: float | None = None) -> None:
    """Print whether ``answer`` solves exercise ``key`` (see :func:`grade`); returns nothing, so a
    notebook cell shows only the verdict."""
    verdict = {None: "not answered yet. Replace None with your answer and run this cell again.",
               True: "correct!", False: "not yet: try again (the hint may help)."}
    print(f"Exercise {key}: {verdict[grade(key, answer, rel_tol)]}")
