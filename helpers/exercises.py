"""Checkable exercises: ``check("00.1", answer)`` compares an answer with the solution computed in
``helpers/solutions/nbNN.py``; a fix-the-code exercise's solution is a *judge*: ``why_not(answer)``
runs the learner's code where the bug bites, returns None or the first failed condition."""
from __future__ import annotations

import importlib
import math
from types import ModuleType
from typing import Any

import numpy as np
import torch


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


def plain(answer: Any) -> Any:
    """A one-element tensor or NumPy array, or a NumPy scalar (``np.float32``, ``np.int64``, ``np.bool_``), as
    the Python number or bool it holds, as ``.item()`` gives it."""
    if isinstance(answer, torch.Tensor) and answer.numel() == 1 and not answer.is_meta:
        return answer.item()
    if isinstance(answer, np.ndarray) and answer.size == 1:
        return answer.item()
    if isinstance(answer, np.generic):
        return answer.item()
    return answer


def _dtype_spelled_as_text(answer: Any, expected: Any) -> str | None:
    """The feedback for a dtype written as a string ("torch.float32", "float32"): the type is wrong, whatever
    the value. None when ``answer`` is not that mistake."""
    if not isinstance(expected, torch.dtype) or not isinstance(answer, str):
        return None
    return (f"the answer should be a dtype object such as torch.float32 (the name, without quotes), "
            f"not the string {answer!r}")


def _mismatch(answer: Any, expected: Any, rel_tol: float) -> str | None:
    """None if ``answer`` matches the computed ``expected``, else what is wrong, in one line."""
    if hasattr(expected, "why_not"):  # a judge: runs the learner's code
        try:
            return expected.why_not(answer)
        except Exception as error:  # the learner's code failed: say how, never raise
            first = (str(error).splitlines() or [""])[0]
            return f"running your code raised {type(error).__name__}: {first}"
    spelled_as_text = _dtype_spelled_as_text(answer, expected)
    if spelled_as_text:
        return spelled_as_text
    number = isinstance(answer, (int, float)) and not isinstance(answer, bool)
    if isinstance(expected, bool):  # 0 is not False: a yes/no question wants True or False
        if not isinstance(answer, bool):
            return f"the answer should be True or False, not {type(answer).__name__}"
        ok = answer is expected
    elif isinstance(expected, (int, float)):
        if not number:
            return f"the answer should be a number, not {type(answer).__name__}"
        ok = (answer == expected if isinstance(expected, int)  # counts, bytes: exact
              else math.isnan(answer) if math.isnan(expected)
              else math.isclose(answer, expected, rel_tol=rel_tol, abs_tol=0.0))
    elif isinstance(expected, str) and isinstance(answer, str):
        ok = answer.strip().lower() == expected.strip().lower()
    else:
        ok = answer == expected
    return None if ok else "that is not the value this exercise computes (the hint may help)"


def feedback(key: str, answer: Any, rel_tol: float | None = None) -> str | None:
    """None if ``answer`` solves exercise ``key``, else one line saying what is still wrong."""
    return _mismatch(plain(answer), solution(key), tolerance(key) if rel_tol is None else rel_tol)


def grade(key: str, answer: Any, rel_tol: float | None = None) -> bool | None:
    """True/False, or None if not answered yet (integers exact, yes/no answers booleans, other
    numbers within ``rel_tol``, default :func:`tolerance`; a one-element tensor or a NumPy scalar is its
    number or bool)."""
    return None if answer is None else feedback(key, answer, rel_tol) is None


def check(key: str, answer: Any, rel_tol: float | None = None) -> None:
    """Print whether ``answer`` solves exercise ``key`` and, if not, the first failed condition."""
    if answer is None:
        print(f"Exercise {key}: not answered yet. Replace None with your answer and run this cell "
              "again.")
        return
    reason = feedback(key, answer, rel_tol)
    print(f"Exercise {key}: " + ("correct!" if reason is None else f"not yet: {reason}."))
