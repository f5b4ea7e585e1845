"""Find dtype leaks: the operations that pull a half-precision run back to float32 (or another dtype).

A model converted with ``.half()`` (or ``.bfloat16()``) should compute in that dtype from input to output.
Tensors created inside ``forward`` without ``dtype=`` (``torch.zeros``, ``torch.full``, ``torch.arange(...) * 0.5``)
are float32 instead; they either crash the next matmul or silently promote everything after them to float32.
:func:`find_dtype_leaks` runs the code once under :func:`helpers.dtype_trace.record_ops` and names the
operations where that happens. It is meant for ``.half()``/``.bfloat16()`` models, not for autocast, where
float32 islands are deliberate.

Limitation: it sees only the operations that actually ran. A branch not taken (``if tokens.shape[1] > 512:``,
``if self.training:``, a padding path for an input without padding) is invisible, so run it on inputs that
exercise every path you deploy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .dtype_trace import OpRecord, record_ops

KINDS = {
    "creates": "creates a new tensor from no floating input of the run (a factory call without dtype=, "
               "or a torch.tensor/as_tensor constant)",
    "mixes": "mixes floating dtypes in its inputs (type promotion)",
    "casts": "casts inputs of the run's dtype to another dtype",
}


# ATen ops that wrap a constant made by torch.tensor/torch.as_tensor: their "input" is that constant, not a tensor
# of the run, so a floating result of another dtype is a creation.
CONSTANT_OPS = frozenset({"lift_fresh", "lift_fresh_copy"})


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Leak:
    """One operation that leaves the run's dtype: its position in the run, its name and its dtypes."""

    index: int
    op: str
    kind: str  # one of KINDS
    input_dtypes: tuple[torch.dtype, ...]
    output_dtype: torch.dtype | None  # None for an op with no floating output (e.g. a comparison)

    def describe(self) -> str:
        """One line such as ``#4 add: mixes float16 + float32 -> float32`` or ``#2 zeros: creates float32``."""
        output = _name(self.output_dtype) if self.output_dtype is not None else "no floating output"
        if self.kind == "creates":
            origin = "a torch.tensor constant" if self.op in CONSTANT_OPS else "no floating input"
            return f"#{self.index} {self.op}: creates {output} ({origin})"
        inputs = " + ".join(_name(d) for d in sorted(set(self.input_dtypes), key=str))
        return f"#{self.index} {self.op}: {self.kind} {inputs} -> {output}"


def classify(record: OpRecord, dtype: torch.dtype) -> str | None:
    """The kind of leak ``record`` is in a run meant to compute in ``dtype``, or None if it is not one.

    The op's first floating output is its result (extra outputs, e.g. saved statistics, are ignored).

    - "mixes": its floating inputs have more than one dtype (the output may or may not stay ``dtype``);
    - "creates": it has no floating input (or wraps a ``torch.tensor`` constant, see ``CONSTANT_OPS``) and
      returns a floating dtype other than ``dtype``;
    - "casts": all its inputs are ``dtype`` and it returns another floating dtype (e.g. ``.float()``).

    An op whose floating inputs all have the same other dtype is not a leak itself: it only carries one forward
    (e.g. ``positions * frequencies`` with int64 positions and float32 frequencies: the leak is where the
    float32 frequencies were created).
    """
    inputs = set(record.input_dtypes)
    if len(inputs) > 1:
        return "mixes"
    if not record.output_dtypes or record.output_dtypes[0] == dtype:
        return None
    if not inputs or record.name in CONSTANT_OPS:
        return "creates"
    if inputs == {dtype}:
        return "casts"
    return None


@dataclass
class LeakReport:
    """What :func:`find_dtype_leaks` saw in one run."""

    dtype: torch.dtype
    leaks: list[Leak]
    op_count: int  # operations recorded
    off_dtype_ops: int  # operations whose result is a floating dtype other than ``dtype`` (leaks and what they spread to)
    error: str | None = None  # "RuntimeError: ..." when the run stopped with an exception
    result: Any = field(default=None, repr=False)

    @property
    def clean(self) -> bool:
        """True when the run finished and every operation computed in ``dtype``."""
        return not self.leaks and self.off_dtype_ops == 0 and self.error is None

    def __str__(self) -> str:
        return self.format()

    def format(self, error_message: bool = True) -> str:
        """The report as text; ``error_message=False`` names only the exception type of an error, whose message
        may differ between PyTorch versions."""
        leaks = f"{len(self.leaks)} leak{'' if len(self.leaks) == 1 else 's'}"
        lines = [f"{_name(self.dtype)} run: {self.op_count} ops, {leaks}, "
                 f"{self.off_dtype_ops} returned another floating dtype"]
        lines += ["  " + leak.describe() for leak in self.leaks]
        if self.error is not None:
            lines.append(f"  stopped by {self.error if error_message else self.error.split(':')[0]}")
        if self.clean:
            lines.append(f"  clean: every op computed in {_name(self.dtype)}")
        return "\n".join(lines)


def find_dtype_leaks(fn: Callable[[], Any], dtype: torch.dtype) -> LeakReport:
    """Run ``fn()`` once and report the operations that leave ``dtype`` (see :func:`classify`).

    Only the code path that ran is seen: operations in branches not taken are not checked.

    An exception raised by ``fn()`` (e.g. a dtype-mismatch ``RuntimeError``) does not propagate: the report
    keeps the operations recorded up to it and the error's first line, since the leak that caused a crash
    usually comes a few ops before it. Raises ``TypeError`` if ``dtype`` is not a floating-point dtype.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype such as torch.float16, not {dtype!r}")
    caught: list[str] = []

    def guarded() -> Any:
        try:
            return fn()
        except Exception as error:  # noqa: BLE001 - reported, not hidden: see LeakReport.error
            caught.append(f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
            return None

    result, records = record_ops(guarded)
    leaks = []
    off_dtype = 0
    for index, record in enumerate(records):
        kind = classify(record, dtype)
        if kind is not None:
            output = record.output_dtypes[0] if record.output_dtypes else None
            leaks.append(Leak(index, record.name, kind, record.input_dtypes, output))
        if record.output_dtypes and record.output_dtypes[0] != dtype:
            off_dtype += 1
    return LeakReport(dtype, leaks, len(records), off_dtype, caught[0] if caught else None, result)
